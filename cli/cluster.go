package cli

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// clusterCommand is `caddy sandwake cluster <ca|cert>`: the cluster CA and
// the node certificates of mutual TLS between nodes, made offline (no API
// call).
func (c *session) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster <ca|cert|secrets>",
		Short: "Makes the cluster CA and node certificates (mutual TLS between nodes)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(c.clusterCACommand(), c.clusterCertCommand(), c.clusterSecretsCommand())
	for _, sub := range cmd.Commands() {
		sub.SilenceErrors, sub.SilenceUsage = true, true
	}
	return cmd
}

// filesOnly refuses --output json for a command that writes files and
// prints no API answer: a script asking for JSON gets an error, not text.
func (c *session) filesOnly(cmd *cobra.Command) error {
	if c.wantJSON() {
		return fmt.Errorf("%s writes files and prints no API answer: --output json does not apply", cmd.CommandPath())
	}
	return nil
}

// clusterCACommand is `caddy sandwake cluster ca --out <dir>`.
func (c *session) clusterCACommand() *cobra.Command {
	var out, name string
	var days int
	cmd := &cobra.Command{
		Use:   "ca --out <dir> [--days 3650]",
		Short: "Makes a cluster CA: <dir>/ca.crt (give it to every node) and <dir>/ca.key (keep it off the nodes)",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write ca.crt and ca.key into (created 0700 if missing)")
	cmd.Flags().IntVar(&days, "days", int(cluster.DefaultCAValidity/(24*time.Hour)), "days the CA is valid")
	cmd.Flags().StringVar(&name, "name", "sandwake cluster CA", "the CA's common name")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		err := func() error {
			if err := c.filesOnly(cmd); err != nil {
				return err
			}
			if out == "" {
				return errors.New("--out <dir> is required")
			}
			if days <= 0 {
				return fmt.Errorf("--days %d: want a positive number", days)
			}
			certPEM, keyPEM, err := cluster.NewCA(name, time.Now(), time.Duration(days)*24*time.Hour)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			certFile, keyFile := filepath.Join(out, "ca.crt"), filepath.Join(out, "ca.key")
			// A CA is never replaced by accident: every node certificate
			// it signed would stop working.
			for _, f := range []string{certFile, keyFile} {
				if _, err := os.Stat(f); err == nil {
					return fmt.Errorf("%s exists: a new CA would not trust the node certificates of the old one (to rotate, make the new CA in another directory and trust both: see the README, \"Securing the cluster\")", f)
				}
			}
			if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
				return err
			}
			if err := writeFileAtomic(certFile, certPEM, 0o644); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s (valid %d days)\ngive every node %s (peer_ca_file); keep %s off the nodes\n",
				certFile, keyFile, days, certFile, keyFile)
			return err
		}()
		if err != nil {
			return c.fail(cmd, err)
		}
		return nil
	}
	return cmd
}

// clusterCertCommand is `caddy sandwake cluster cert --node <name> --addr
// <ip>[,…] --ca <dir> --out <dir> [--days 30]`.
func (c *session) clusterCertCommand() *cobra.Command {
	var node, caDir, out string
	var addrs []string
	var days int
	cmd := &cobra.Command{
		Use:   "cert --node <name> --addr <ip>[,<ip>…] --ca <dir> --out <dir> [--days 30]",
		Short: "Issues a node certificate: <out>/<node>.crt and <out>/<node>.key, signed by the CA in <dir>",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&node, "node", "", "the node's name (its cluster option node)")
	cmd.Flags().StringSliceVar(&addrs, "addr", nil, "the addresses other nodes dial it at (advertise's host): IPs, or DNS names")
	cmd.Flags().StringVar(&caDir, "ca", "", "directory holding ca.crt and ca.key")
	cmd.Flags().StringVar(&out, "out", "", "directory to write <node>.crt and <node>.key into")
	cmd.Flags().IntVar(&days, "days", int(cluster.DefaultNodeValidity/(24*time.Hour)), "days the certificate is valid")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		err := func() error {
			if err := c.filesOnly(cmd); err != nil {
				return err
			}
			switch {
			case node == "":
				return errors.New("--node <name> is required")
			case !lifecycle.ValidInstance(node):
				return fmt.Errorf("--node %q: want 1-63 characters of [a-z0-9_.-] starting with a letter or digit", node)
			case len(addrs) == 0:
				return errors.New("--addr <ip>[,<ip>…] is required: the addresses the other nodes dial this node at")
			case caDir == "" || out == "":
				return errors.New("--ca <dir> and --out <dir> are required")
			case days <= 0:
				return fmt.Errorf("--days %d: want a positive number", days)
			}
			caCert, err := os.ReadFile(filepath.Join(caDir, "ca.crt"))
			if err != nil {
				return fmt.Errorf("reading the CA: %w", err)
			}
			caKey, err := os.ReadFile(filepath.Join(caDir, "ca.key"))
			if err != nil {
				return fmt.Errorf("reading the CA key: %w", err)
			}
			certPEM, keyPEM, err := cluster.IssueNodeCert(caCert, caKey, cluster.NodeCertRequest{
				Node: node, Hosts: addrs, Validity: time.Duration(days) * 24 * time.Hour,
			}, time.Now())
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			certFile, keyFile := filepath.Join(out, node+".crt"), filepath.Join(out, node+".key")
			// Key first, each replaced whole: a reload that reads the pair
			// midway sees the old pair or a key without its certificate,
			// which it refuses, never half a file.
			if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
				return err
			}
			if err := writeFileAtomic(certFile, certPEM, 0o644); err != nil {
				return err
			}
			until := "?"
			if blk, _ := pem.Decode(certPEM); blk != nil {
				if leaf, err := x509.ParseCertificate(blk.Bytes); err == nil {
					until = leaf.NotAfter.UTC().Format(time.RFC3339) // capped at the CA's end
				}
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s (node %s; %s; valid until %s)\n"+
				"cluster block: peer_cert_file %s  peer_key_file %s  peer_ca_file %s\n"+
				"renew before it ends: run this again, then reload Caddy\n",
				certFile, keyFile, node, strings.Join(addrs, ", "), until, certFile, keyFile, filepath.Join(caDir, "ca.crt"))
			return err
		}()
		if err != nil {
			return c.fail(cmd, err)
		}
		return nil
	}
	return cmd
}

// writeFileAtomic writes data to path through a temporary file renamed
// over it, with mode perm.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: nothing to remove
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
