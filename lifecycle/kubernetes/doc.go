// Package kubernetes implements lifecycle.Runtime on a Kubernetes API
// server with client-go: a sandbox is a PersistentVolumeClaim s-<id>-data
// (its workspace, from create to purge, which also keeps the pod the create
// asked for) and, while it runs, a Pod s-<id> that mounts it, behind a
// NetworkPolicy s-<id> (its egress policy, made before the pod). Reads come
// from informers over the instance's objects, so the request path makes no
// API call; the gateway dials the pod's own address.
//
// Everything only Kubernetes needs (informers, claims, pod security) stays
// here: lifecycle does not learn the word pod. It must not import Caddy, the
// store or any package of the gateway.
package kubernetes
