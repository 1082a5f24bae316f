package preview

import "strings"

// reasonSentences explains a record's reason code to an anonymous visitor
// of a preview host. It is the only text about a failure that unauthenticated
// answers (pages, /.well-known/sandwake/status, held requests, wake answers)
// carry: the raw error (Record.Error) may hold host paths, resolver and
// registry addresses and registry response bodies, so it stays in the
// management API and the logs.
var reasonSentences = map[string]string{
	"image_missing":      "Its image is not available on the host.",
	"not_ready":          "Its app did not start answering in time.",
	"start_failed":       "Its container could not be started.",
	"engine_unavailable": "The container engine could not be reached.",
	"id_taken":           "Another container already uses this sandbox's name.",
	"stuck_creating":     "It took too long to be created.",
	"container_missing":  "Its container was removed.",
	"exited":             "Its app exited.",
	"oom":                "Its app ran out of memory.",
	"max_lifetime":       "It reached its maximum lifetime.",
	"capacity":           "The host has no room for another running sandbox.",
	"unavailable":        "The container engine could not be reached.",
	"circuit_open":       "The container engine could not be reached; wakes are refused for a few seconds (circuit open).",
	"timeout":            "It took too long to start.",
	"failed":             "Its container could not be started.",
	"conflict":           "It cannot be woken in its current state.",
	"disk_quota":         "It wrote more to its disk than its quota allows.",
}

// reasonSentenceUnknown is the sentence of a code without one of its own.
const reasonSentenceUnknown = "The reason is recorded for the sandbox's owner."

// reasonSentence is the plain sentence for a reason or error code. Codes
// with a detail in parentheses, such as "exited(137)", read as their base.
func reasonSentence(code string) string {
	base, _, _ := strings.Cut(code, "(")
	if s, ok := reasonSentences[base]; ok {
		return s
	}
	return reasonSentenceUnknown
}
