package cli

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestMakeSecretKeepsWhatExists: the install's Secrets are made when absent
// (a random token; a CA and a random secret) and an existing one, an
// operator's own, is kept as it is.
func TestMakeSecretKeepsWhatExists(t *testing.T) {
	ctx := context.Background()
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: APISecret, Namespace: "ns"}, Data: map[string][]byte{"token": []byte("the operator's")}}
	cli := fake.NewClientset(mine)
	made, err := makeSecret(ctx, cli, "ns", APISecret)
	if err != nil || made {
		t.Fatalf("an existing %s: made %v, %v; want it kept", APISecret, made, err)
	}
	got, _ := cli.CoreV1().Secrets("ns").Get(ctx, APISecret, metav1.GetOptions{})
	if string(got.Data["token"]) != "the operator's" {
		t.Fatalf("the operator's token became %q", got.Data["token"])
	}
	made, err = makeSecret(ctx, cli, "ns", ClusterSecret)
	if err != nil || !made {
		t.Fatalf("an absent %s: made %v, %v", ClusterSecret, made, err)
	}
	cs, _ := cli.CoreV1().Secrets("ns").Get(ctx, ClusterSecret, metav1.GetOptions{})
	if len(cs.Data["ca.crt"]) == 0 || len(cs.Data["ca.key"]) == 0 || len(cs.Data["secret"]) != 64 {
		t.Fatalf("the cluster Secret made: keys %v, secret of %d characters; want ca.crt, ca.key and 64", keys(cs.Data), len(cs.Data["secret"]))
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
