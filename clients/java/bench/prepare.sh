#!/usr/bin/env bash
# The build line of README.md: the SDK and the filter into ~/.m2 as their
# READMEs install them, then the app with its dependencies in target/lib.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
mvn -B -q -f clients/java/pom.xml install -DskipTests
mvn -B -q -f clients/java/servlet/pom.xml install -DskipTests
mvn -B -q -f clients/java/bench/pom.xml package
