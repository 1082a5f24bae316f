package preview

import (
	"testing"
)

func TestParseHost(t *testing.T) {
	tests := []struct {
		host   string
		domain string
		id     string
		port   int
		ok     bool
	}{
		{"s-abc123-8080.preview.localhost", "localhost", "abc123", 8080, true},
		{"s-abc123-8080.preview.localhost:8080", "localhost", "abc123", 8080, true},
		{"s-abc123-8080.preview.localhost.", "localhost", "abc123", 8080, true},
		{"S-ABC123-8080.PREVIEW.LocalHost", "localhost", "abc123", 8080, true},
		{"s-01hzx7k2m3n4p5q6r7s8t9v0wx-3000.preview.example.com", "example.com", "01hzx7k2m3n4p5q6r7s8t9v0wx", 3000, true},
		{"s-a-1.preview.localhost", "localhost", "a", 1, true},
		{"s-a-65535.preview.localhost", "localhost", "a", 65535, true},
		{"s-a-0.preview.localhost", "localhost", "", 0, false},
		{"s-a-65536.preview.localhost", "localhost", "", 0, false},
		{"s-a-08080.preview.localhost", "localhost", "", 0, false},
		{"s-a-+80.preview.localhost", "localhost", "", 0, false},
		{"s-a-.preview.localhost", "localhost", "", 0, false},
		{"s--80.preview.localhost", "localhost", "", 0, false},
		{"s-a_b-80.preview.localhost", "localhost", "", 0, false},
		{"s-a-b-80.preview.localhost", "localhost", "", 0, false},
		{"s-a.b-80.preview.localhost", "localhost", "", 0, false},
		{"x.s-a-80.preview.localhost", "localhost", "", 0, false},
		{"s-a-80.x.preview.localhost", "localhost", "", 0, false},
		{"s-a-80.preview.example.com", "localhost", "", 0, false},
		{"s-a-80.previewXlocalhost", "localhost", "", 0, false},
		{"s-a-80.preview.notlocalhost", "localhost", "", 0, false},
		{"t-a-80.preview.localhost", "localhost", "", 0, false},
		{"sa-80.preview.localhost", "localhost", "", 0, false},
		{"preview.localhost", "localhost", "", 0, false},
		{"", "localhost", "", 0, false},
		{"s-" + string(make([]byte, 0)) + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-80.preview.localhost", "localhost", "", 0, false},
		{"s-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-80.preview.localhost", "localhost", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 80, true},
		{"s-é-80.preview.localhost", "localhost", "", 0, false},
	}
	for _, tt := range tests {
		id, port, ok := ParseHost(tt.host, tt.domain)
		if id != tt.id || port != tt.port || ok != tt.ok {
			t.Errorf("parseHost(%q) = %q, %d, %v; want %q, %d, %v", tt.host, id, port, ok, tt.id, tt.port, tt.ok)
		}
	}
}

func TestParseHostDoesNotAllocate(t *testing.T) {
	allocs := testing.AllocsPerRun(1000, func() {
		ParseHost("s-abc123-8080.preview.localhost:8080", "localhost")
	})
	if allocs != 0 {
		t.Fatalf("parseHost allocates %v times per call", allocs)
	}
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"s-abc-80.preview.localhost", "S-A-1.PREVIEW.LOCALHOST:443", "s--.preview.", "s-a-99999.preview.localhost"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		id, port, ok := ParseHost(host, "localhost")
		if !ok {
			return
		}
		if port < 1 || port > 65535 || len(id) == 0 || len(id) > 40 {
			t.Fatalf("accepted %q as %q:%d", host, id, port)
		}
		for _, c := range []byte(id) {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
				t.Fatalf("accepted %q with id %q", host, id)
			}
		}
		// What was accepted round-trips.
		if id2, port2, ok2 := ParseHost(previewHost(id, port, "localhost"), "localhost"); !ok2 || id2 != id || port2 != port {
			t.Fatalf("round trip of %q failed", host)
		}
	})
}
