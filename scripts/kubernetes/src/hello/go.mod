module sandwake.local/k8s-hello

go 1.24
