package cli

import "github.com/spf13/cobra"

// helpTemplate is the help of `caddy sandwake` and its commands: what the
// command does, then its usage. Caddy's root command appends its own
// footer (where Caddy's documentation is) to the help of every command; it
// is not sandwake's, so the sandwake tree has a template of its own.
const helpTemplate = `{{with (or .Long .Short)}}{{. | trim}}

{{end}}{{.UsageString}}`

// usageTemplate is cobra's usage without the blank line and the "Use
// … --help for more information" line at its end: the commands are listed
// with their summaries, and each command's flags are shown under it.
const usageTemplate = `Usage:
  {{if .HasAvailableSubCommands}}{{.CommandPath}} <command> [flags]{{else}}{{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}

Commands:{{range .Commands}}{{if .IsAvailableCommand}}
  {{rpad .Name .NamePadding}} {{.Short}}{{end}}{{end}}{{end}}{{if .HasExample}}

Examples:
{{.Example | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableInheritedFlags}}

Global flags:
{{.InheritedFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}
`

// setHelpTemplates gives cmd and every command under it the sandwake help
// and usage (cobra looks a template up from a command towards the root).
func setHelpTemplates(cmd *cobra.Command) {
	cmd.SetHelpTemplate(helpTemplate)
	cmd.SetUsageTemplate(usageTemplate)
}
