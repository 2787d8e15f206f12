package dev.idemd.servlet;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import org.junit.jupiter.api.condition.EnabledIfEnvironmentVariable;

/**
 * A test class that runs against a live idemd started from {@code $IDEMD_BIN}: skipped without it,
 * so that {@code mvn -f clients/java/servlet/pom.xml install} (README) works on a fresh clone with
 * only a JDK and Maven. clients/java/test.sh always sets IDEMD_BIN and fails when any test of this
 * module was skipped.
 */
@Target(ElementType.TYPE)
@Retention(RetentionPolicy.RUNTIME)
@EnabledIfEnvironmentVariable(
    named = "IDEMD_BIN",
    matches = ".+",
    disabledReason = "needs a live idemd: set IDEMD_BIN to an idemd binary (clients/java/test.sh does)")
@interface NeedsIdemd {}
