// Package lifecycletest provides an in-memory container engine for tests of
// code that drives a lifecycle.Manager: lifecycle's own tests and the
// unit tests of the layers above it. It is the fake of lifecycle.Runtime
// (as Sablier's providertest is of its Provider); real-engine behaviour is
// tested against Docker.
package lifecycletest
