// Package kubetest holds what tests and the bench on a real Kubernetes
// cluster share: the cluster's facts from the environment (skip without
// them, fail under SANDWAKE_REQUIRE_KUBERNETES=1), the testapp image built
// and imported into the cluster's containerd (never pulled), and the check
// that an address is on the cluster's CNI bridge before anything is sent to
// it. It imports nothing of sandwake but testenv.
package kubetest
