package idemd

// The gRPC stubs in gen/ are generated from proto/idemd/v1/idempotency.proto
// and committed, because a module fetched with `go get` is compiled as
// published and cannot run a generator. After changing the proto, run
// `go generate .` here (or scripts/generate.sh) and commit gen/; test.sh
// fails while the committed stubs differ from what the script produces.
//go:generate bash scripts/generate.sh
