package preview

import (
	"strconv"
	"strings"

	"github.com/sandwake/sandwake/lifecycle"
)

// previewLabel is the label between a sandbox's label and the domain.
const previewLabel = "preview"

// ParseHost splits a preview host "s-<id>-<port>.preview.<domain>" (with an
// optional :port and trailing dot) into the sandbox id and port. The id is
// matched case-insensitively and returned lowercase; the port has no leading
// zero and is 1–65535. Anything else, extra labels and other domains included,
// is not a preview host. It allocates only to lowercase an id written with
// upper-case letters.
func ParseHost(host, domain string) (id string, port int, ok bool) {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	host = strings.TrimSuffix(host, ".")
	// host = label "." "preview" "." domain
	if len(host) < len(domain)+len(previewLabel)+2 {
		return "", 0, false
	}
	suffixAt := len(host) - len(domain)
	if !strings.EqualFold(host[suffixAt:], domain) || host[suffixAt-1] != '.' {
		return "", 0, false
	}
	rest := host[:suffixAt-1]
	pAt := len(rest) - len(previewLabel)
	if pAt < 2 || !strings.EqualFold(rest[pAt:], previewLabel) || rest[pAt-1] != '.' {
		return "", 0, false
	}
	label := rest[:pAt-1]
	if len(label) < 2 || (label[0] != 's' && label[0] != 'S') || label[1] != '-' {
		return "", 0, false
	}
	label = label[2:]
	dash := strings.LastIndexByte(label, '-')
	if dash < 1 {
		return "", 0, false
	}
	id, portStr := label[:dash], label[dash+1:]
	port, ok = parsePort(portStr)
	if !ok || len(id) > lifecycle.MaxIDLen {
		return "", 0, false
	}
	upper := false
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z':
		case c >= 'A' && c <= 'Z':
			upper = true
		default:
			return "", 0, false
		}
	}
	if upper {
		id = strings.ToLower(id)
	}
	return id, port, true
}

// parsePort parses a decimal port 1–65535 without sign or leading zero.
func parsePort(s string) (int, bool) {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, false
	}
	return n, true
}

// ValidDomain reports whether d is a plausible DNS name for the preview
// domain (letters, digits, hyphens, dots; no empty label).
func ValidDomain(d string) bool {
	if d == "" || len(d) > 200 || d[0] == '.' || d[len(d)-1] == '.' || strings.Contains(d, "..") {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// previewHost is the host of sandbox id's port on domain.
func previewHost(id string, port int, domain string) string {
	return "s-" + id + "-" + strconv.Itoa(port) + "." + previewLabel + "." + domain
}
