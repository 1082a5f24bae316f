// Package kubetest holds what tests and the bench on a real Kubernetes
// cluster share: the cluster's facts from the environment (skip without
// them, fail under SANDWAKE_REQUIRE_KUBERNETES=1), the testapp image built
// and imported into the cluster's containerd (never pulled) as any image
// tarball can be, the check that an address is on the cluster's CNI bridge
// before anything is sent to it, and the API server forwarded to the pods
// (the test cluster has no kube-proxy). It imports nothing of sandwake but
// testenv.
package kubetest
