// Command demo makes the demo sandbox image (internal/testapp, compiled
// static and imported through the Docker API: nothing is pulled) available
// as sandwake-demo:latest, or <$SANDWAKE_DEMO_IMAGE>:latest. `make run`
// calls it. The image is imported only when the binary changed; the one it
// replaces is removed (see ensureImage).
//
// `demo leftover <id>` removes a demo sandbox an earlier `make run` left
// under another gateway instance (its store was deleted); `demo clean
// <id>` removes the demo sandbox and the demo image (`make clean-demo`).
package main
