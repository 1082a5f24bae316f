package cli

// The CLI's output: --output json|table, and the human-readable forms
// (tables, one sandbox, events).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandwake/sandwake/client"
)

// outputFormat is the value of --output: how a command prints what the
// API answered.
type outputFormat string

// The values of --output.
const (
	// outputTable is the form for people: tables, "key: value" lines, one
	// summary line (the default).
	outputTable outputFormat = "table"
	// outputJSON is the API's JSON answer, pretty-printed: for scripts.
	outputJSON outputFormat = "json"
)

// String implements pflag.Value.
func (o *outputFormat) String() string { return string(*o) }

// Set implements pflag.Value: json or table, nothing else.
func (o *outputFormat) Set(s string) error {
	switch f := outputFormat(strings.ToLower(s)); f {
	case outputTable, outputJSON:
		*o = f
		return nil
	}
	return fmt.Errorf("want %s or %s", outputJSON, outputTable)
}

// Type implements pflag.Value; help shows it as the flag's argument.
func (o *outputFormat) Type() string { return "json|table" }

// printJSON prints a JSON answer of the API pretty-printed, its fields in
// the API's order; an answer that is not JSON is printed as it came.
// An empty answer (a 204) prints nothing.
func printJSON(w io.Writer, raw []byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		b.Reset()
		b.Write(raw)
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// writeTable prints sandboxes as an aligned table.
func writeTable(w io.Writer, recs []client.Sandbox, now time.Time) error {
	// A NODE column when the sandboxes live on more than one node (a
	// cluster); a single host's table stays as it was.
	nodes := false
	for i := range recs {
		nodes = nodes || recs[i].Node != recs[0].Node
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if nodes {
		fmt.Fprintln(tw, "ID\tSTATE\tNODE\tPORTS\tLAST ACTIVE\tURL")
	} else {
		fmt.Fprintln(tw, "ID\tSTATE\tPORTS\tLAST ACTIVE\tURL")
	}
	for i := range recs {
		r := &recs[i]
		ports := make([]string, len(r.Ports))
		for j, p := range r.Ports {
			ports[j] = strconv.Itoa(p)
		}
		state := r.State
		if nodes {
			state += "\t" + orDash(r.Node)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, state, orDash(strings.Join(ports, ",")),
			relTime(r.LastActiveAt, now), orDash(r.FirstURL()))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// relTime renders t relative to now: "12s ago", "in 3m", "-" for none.
func relTime(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	suffix := " ago"
	if d < 0 {
		d, suffix = -d, ""
	}
	var s string
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		s = fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	if suffix == "" {
		return "in " + s
	}
	return s + suffix
}

// writeRecord prints a sandbox as aligned "key: value" lines, leaving out
// what is not set.
func writeRecord(w io.Writer, r *client.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	at := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.Local().Format(time.RFC3339) + " (" + relTime(t, now) + ")"
	}
	optAt := func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return at(*t)
	}
	line("id", r.ID)
	line("state", r.State)
	line("reason", r.Reason)
	line("error", r.Error)
	line("image", r.Image)
	if len(r.Cmd) > 0 {
		line("cmd", strings.Join(r.Cmd, " "))
	}
	for _, p := range r.Ports {
		line("url "+strconv.Itoa(p), orDash(r.URLs[strconv.Itoa(p)]))
	}
	line("env", strings.Join(r.EnvKeys, ", "))
	if r.MemoryMB > 0 {
		line("memory", fmt.Sprintf("%d MiB", r.MemoryMB))
	}
	if r.GroupMemoryMB > 0 {
		line("group memory", fmt.Sprintf("%d MiB (app and services)", r.GroupMemoryMB))
	}
	for _, l := range serviceLines(r.Services) {
		line(l[0], l[1])
	}
	if r.CPUs > 0 {
		line("cpus", strconv.FormatFloat(r.CPUs, 'f', -1, 64))
	}
	line("workspace", r.WorkspacePath)
	line("ready path", r.ReadyPath)
	line("idle pause", r.IdlePause)
	line("idle stop", r.IdleStop)
	line("max lifetime", r.MaxLifetime)
	labels := make([]string, 0, len(r.Labels))
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		labels = append(labels, k+"="+r.Labels[k])
	}
	line("labels", strings.Join(labels, ", "))
	line("access", r.Access)
	if r.PublicCard {
		line("public card", "on (unfurl bots see its link card without a token)")
	}
	if r.Egress != nil {
		line("egress", egressText(r.Egress))
	}
	line("activity", r.Activity)
	line("address", r.Address)
	if r.Address != "" {
		line("egress denied", strconv.FormatUint(r.EgressDenied, 10))
	}
	line("created", at(r.CreatedAt))
	line("last active", at(r.LastActiveAt))
	line("state since", at(r.StateSince))
	line("expires", optAt(r.ExpiresAt))
	line("keepalive until", optAt(r.KeepaliveUntil))
	line("verified", optAt(r.VerifiedAt))
	line("open connections", strconv.FormatInt(r.OpenConnections, 10))
	return tw.Flush()
}

// writeEgressLog prints what a sandbox tried outbound: the names it looked
// up, then its connections, each an aligned table newest first, and under
// the learn policy the allow list a lock would make.
func writeEgressLog(w io.Writer, l *client.EgressLog, now time.Time) error {
	verdict := func(allowed bool) string {
		if allowed {
			return "allowed"
		}
		return "denied"
	}
	fmt.Fprintf(w, "sandbox %s egress %s\n", l.ID, orDash(l.Policy))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(l.Lookups) == 0 {
		fmt.Fprintln(tw, "no lookups")
	} else {
		fmt.Fprintln(tw, "LOOKUP\tVERDICT\tCOUNT\tLAST\tADDRESSES")
		for _, lk := range l.Lookups {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", lk.Name, verdict(lk.Allowed), lk.Count, relTime(lk.Last, now), orDash(strings.Join(lk.Addrs, ",")))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(l.Decisions) == 0 {
		fmt.Fprintln(tw, "no connections")
	} else {
		fmt.Fprintln(tw, "DESTINATION\tNAME\tVERDICT\tCOUNT\tLAST")
		for i := range l.Decisions {
			d := &l.Decisions[i]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", d.Destination(), orDash(d.Name), verdict(d.Allowed), d.Count, relTime(d.Last, now))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l.Learned != nil {
		_, err := fmt.Fprintf(w, "\nlearned: %s (caddy sandwake egress %s --lock makes it the allow list under none)\n", orDash(strings.Join(l.Learned, " ")), l.ID)
		return err
	}
	return nil
}

// writeSummary prints the one line an operation answers with:
// "sandbox <id> <state>  <url>".
func writeSummary(w io.Writer, r *client.Sandbox, extra string) error {
	s := fmt.Sprintf("sandbox %s %s", r.ID, r.State)
	if u := r.FirstURL(); u != "" {
		s += "  " + u
	}
	if extra != "" {
		s += "  " + extra
	}
	_, err := fmt.Fprintln(w, s)
	return err
}

// formatBytes renders n in binary units: "512 B", "1.2 MiB".
func formatBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n) / 1024
	units := "KMGTPE"
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}

// writeEvent prints an event of the stream (its JSON) as writeEventLine
// does.
func writeEvent(w io.Writer, data string) error {
	ev, err := client.Message{Data: data}.Event()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return writeEventLine(w, ev)
}

// writeEventLine prints an event as "<at> <sandbox> <from> → <to>
// (<reason>)". An event that is not a transition (destroyed, purged) shows
// its type as the target.
func writeEventLine(w io.Writer, ev client.Event) error {
	to := ev.To
	if to == "" {
		to = strings.TrimPrefix(ev.Type, "sandbox.")
	}
	s := fmt.Sprintf("%s %s %s → %s", ev.At.Format(time.RFC3339), ev.SandboxID, orDash(ev.From), orDash(to))
	if ev.Reason != "" {
		s += " (" + ev.Reason + ")"
	}
	_, err := fmt.Fprintln(w, s)
	return err
}

// writeIdentity prints what a token may do as "key: value" lines.
func writeIdentity(w io.Writer, id client.Identity) error {
	labels := make([]string, 0, len(id.Labels))
	for _, k := range slices.Sorted(maps.Keys(id.Labels)) {
		labels = append(labels, k+"="+id.Labels[k])
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "scope:\t%s\n", id.Scope)
	fmt.Fprintf(tw, "labels:\t%s\n", orDash(strings.Join(labels, ", ")))
	return tw.Flush()
}
