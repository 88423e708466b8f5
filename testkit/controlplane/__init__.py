"""A real kube-apiserver, etcd and kube-proxy, built from the Go module proxy, for tests."""
