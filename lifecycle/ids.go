package lifecycle

import (
	"crypto/rand"
	"encoding/binary"
	"time"
)

// MaxIDLen is the longest sandbox id: ids are 1–40 characters of [0-9a-z].
const MaxIDLen = 40

// ValidID reports whether id is a well-formed, already lowercase sandbox id.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// crockford is Crockford's base32 alphabet, lowercased: ULIDs that sort by
// creation time and fit the id alphabet.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// NewID returns a lowercase ULID (26 characters): 48 bits of milliseconds
// since the epoch followed by 80 random bits.
func NewID(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	rand.Read(b[6:]) // never fails (crypto/rand panics on failure)
	// Encode the 128 bits as 26 base32 digits, most significant first; the
	// first digit carries the top 3 bits.
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// NewIncarnation returns a random 64-bit value in hex: one per create of an
// id, so that what was bound to an earlier sandbox of the same id (preview
// tokens, ownership) never carries over to a later one.
func NewIncarnation() string {
	var b [8]byte
	rand.Read(b[:])
	const hexdigits = "0123456789abcdef"
	out := make([]byte, 16)
	for i, c := range b {
		out[2*i], out[2*i+1] = hexdigits[c>>4], hexdigits[c&15]
	}
	return string(out)
}

// ValidInstance reports whether name can be a gateway instance's name (a
// cluster node's is its instance's) or a sandbox network's: a Docker label
// value and network name, short and plain: 1-63 characters of [a-z0-9_.-],
// starting with a letter or digit.
func ValidInstance(name string) bool {
	if len(name) == 0 || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_' || c == '.') && i > 0:
		default:
			return false
		}
	}
	return true
}
