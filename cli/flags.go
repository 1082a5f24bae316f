package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagAliases are the other names create's flags answer to: the API's
// plural and the short forms people type.
var flagAliases = map[string]string{
	"ports":  "port",
	"memory": "memory-mb",
	"mem":    "memory-mb",
	"labels": "label",
	"disk":   "disk-mb",
}

// apiFlagNames normalises a flag name: the API's snake_case (memory_mb,
// ready_path) is the flag's kebab-case, and flagAliases apply.
func apiFlagNames(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	name = strings.ReplaceAll(name, "_", "-")
	if a, ok := flagAliases[name]; ok {
		name = a
	}
	return pflag.NormalizedName(name)
}

// suggestFlag adds "did you mean --x?" to an unknown-flag error when one of
// cmd's flags is close to the name given.
func suggestFlag(cmd *cobra.Command, err error) error {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return err
	}
	best, bestD := "", 3
	visit := func(f *pflag.Flag) {
		if d := editDistance(name, f.Name); d < bestD || (d == bestD && best == "") {
			if d < 3 {
				best, bestD = f.Name, d
			}
		}
		if strings.HasPrefix(f.Name, name) && best == "" {
			best = f.Name
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	if best == "" {
		return fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())
	}
	return errors.New(msg + "; did you mean --" + best + "?")
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
