package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/engine"
)

// Secrets `caddy sandwake cluster secrets` makes, as deploy/kubernetes's
// gateways read them.
const (
	APISecret     = "sandwake-api"     // key token: the API's bearer token
	ClusterSecret = "sandwake-cluster" // keys ca.crt, ca.key, secret
)

// clusterSecretsCommand is `caddy sandwake cluster secrets --namespace
// <ns>`: deploy/kubernetes's init Job runs it, so that `kubectl apply -k`
// alone installs.
func (c *session) clusterSecretsCommand() *cobra.Command {
	var ns, kubeconfig string
	cmd := &cobra.Command{
		Use:   "secrets --namespace <ns> [--kubeconfig <file>]",
		Short: "Makes the gateways' Secrets in a Kubernetes namespace, each only if absent: " + APISecret + " (a random API token) and " + ClusterSecret + " (a cluster CA and a random cluster secret)",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&ns, "namespace", "", "the gateways' namespace")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in the cluster, else $KUBECONFIG or ~/.kube/config)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		err := func() error {
			if err := c.filesOnly(cmd); err != nil {
				return err
			}
			if ns == "" {
				return errors.New("--namespace <ns> is required")
			}
			cli, server, err := engine.KubernetesClient(kubeconfig)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			for _, name := range []string{APISecret, ClusterSecret} {
				made, err := makeSecret(ctx, cli, ns, name)
				if err != nil {
					return fmt.Errorf("secret %s/%s at %s: %w", ns, name, server, err)
				}
				what := "kept (it exists)"
				if made {
					what = "made"
				}
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "secret %s/%s: %s\n", ns, name, what); err != nil {
					return err
				}
			}
			return nil
		}()
		if err != nil {
			return c.fail(cmd, err)
		}
		return nil
	}
	return cmd
}

// makeSecret creates Secret name in ns with fresh values unless it exists
// (an operator's own, or one made before, is never replaced: the token
// would change under its users, the CA under the replicas); it reports
// whether it made it.
func makeSecret(ctx context.Context, cli kubernetes.Interface, ns, name string) (bool, error) {
	data := map[string][]byte{}
	switch name {
	case APISecret:
		data["token"] = []byte(randomToken())
	case ClusterSecret:
		caPEM, keyPEM, err := cluster.NewCA("sandwake cluster CA ("+ns+")", time.Now(), cluster.DefaultCAValidity)
		if err != nil {
			return false, err
		}
		data["ca.crt"], data["ca.key"], data["secret"] = caPEM, keyPEM, []byte(randomToken())
	}
	_, err := cli.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "sandwake"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	return err == nil, err
}

// randomToken is 32 random bytes in hex.
func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
