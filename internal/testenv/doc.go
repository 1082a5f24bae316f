// Package testenv holds what sandwake's tests share: a Docker connection that
// fails (not skips) under SANDWAKE_REQUIRE_DOCKER=1, the testapp image built
// and imported once per test binary, unique ids, polling, and cleanup of
// everything a test run made on the engine.
package testenv
