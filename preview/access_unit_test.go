package preview

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/sandwake/sandwake/gateway"
)

func TestWithoutCookie(t *testing.T) {
	tests := []struct {
		name, in, want string
		removed        bool
	}{
		{"only ours", "sandwake_token=swt_x", "", true},
		{"first", "sandwake_token=swt_x; a=1", "a=1", true},
		{"middle", "a=1; sandwake_token=swt_x; b=2", "a=1; b=2", true},
		{"last", "a=1; sandwake_token=swt_x", "a=1", true},
		{"last after a space", "a=1; b=2 ; sandwake_token=swt_x", "a=1; b=2", true},
		{"twice", "sandwake_token=old; a=1; sandwake_token=new", "a=1", true},
		{"no space", "a=1;sandwake_token=swt_x;b=2", "a=1;b=2", true},
		{"odd bytes kept", `sandwake_token=swt_x; d=a"b; e=ü; c=x y; f="q"; g`, `d=a"b; e=ü; c=x y; f="q"; g`, true},
		{"spacing kept", "a=1;  b=2 ; sandwake_token=swt_x;c=3", "a=1;  b=2 ;c=3", true},
		{"name only", "sandwake_token; a=1", "a=1", true},
		{"similar names kept", "xsandwake_token=1; sandwake_token_x=2; Sandwake_token=3", "xsandwake_token=1; sandwake_token_x=2; Sandwake_token=3", false},
		{"value mentions ours", "a=sandwake_token=1", "a=sandwake_token=1", false},
		{"none", `d=a"b; e=ü`, `d=a"b; e=ü`, false},
	}
	for _, tt := range tests {
		got, removed := withoutCookie(tt.in, gateway.TokenCookie)
		if got != tt.want || removed != tt.removed {
			t.Errorf("%s: withoutCookie(%q) = %q, %v; want %q, %v", tt.name, tt.in, got, removed, tt.want, tt.removed)
		}
	}
}

func TestStripToken(t *testing.T) {
	tests := []struct {
		name       string
		header     http.Header
		wantCookie []string
		wantAuth   []string
	}{
		{"app cookies byte for byte", http.Header{"Cookie": {`sandwake_token=swt_x; d=a"b; e=ü; c=x y`}}, []string{`d=a"b; e=ü; c=x y`}, nil},
		{"several Cookie fields", http.Header{"Cookie": {"a=1", "sandwake_token=swt_x", `b="2"`}}, []string{"a=1", `b="2"`}, nil},
		{"nothing of ours", http.Header{"Cookie": {`d=a"b`}, "Authorization": {"Bearer app-token"}}, []string{`d=a"b`}, []string{"Bearer app-token"}},
		{"bearer", http.Header{"Authorization": {"Bearer swt_x.y"}}, nil, nil},
		{"lower-case bearer", http.Header{"Authorization": {"bearer swt_x.y"}}, nil, nil},
		{"upper-case bearer", http.Header{"Authorization": {"BEARER swt_x.y"}}, nil, nil},
		{"the app's own bearer kept", http.Header{"Authorization": {"bearer swt_x.y", "Bearer app"}}, nil, []string{"Bearer app"}},
		{"basic kept", http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}, nil, []string{"Basic dXNlcjpwYXNz"}},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header = tt.header.Clone()
		stripToken(r)
		if got := r.Header.Values("Cookie"); !slices.Equal(got, tt.wantCookie) {
			t.Errorf("%s: Cookie %q, want %q", tt.name, got, tt.wantCookie)
		}
		if got := r.Header.Values("Authorization"); !slices.Equal(got, tt.wantAuth) {
			t.Errorf("%s: Authorization %q, want %q", tt.name, got, tt.wantAuth)
		}
	}
}

func TestPresentedTokenSchemes(t *testing.T) {
	for _, auth := range []string{"Bearer swt_a.b", "bearer swt_a.b", "BEARER swt_a.b", "Bearer  swt_a.b"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", auth)
		if tok, q := presentedToken(r); tok != "swt_a.b" || q {
			t.Errorf("Authorization %q: token %q (query %v)", auth, tok, q)
		}
	}
}

func TestLocalPath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/", "/"},
		{"/files/x?a=1&b=2", "/files/x?a=1&b=2"},
		{"/%2F%2Fevil.example/x", "/%2F%2Fevil.example/x"},
		{"/%5Cevil.example", "/%5Cevil.example"},
		{"/a//b", "/a//b"},
		{"", "/"},
		{"//evil.example/x", "/"},
		{"///evil.example", "/"},
		{`/\evil.example`, "/"},
		{`\\evil.example`, "/"},
		{`\/evil.example`, "/"},
		{"/\t/evil.example", "/"},
		{"/\n/evil.example", "/"},
		{"/\r/evil.example", "/"},
		{" //evil.example", "/"},
		{"/ /x", "/"},
		{"http://evil.example/", "/"},
		{"https:evil.example", "/"},
		{"javascript:alert(1)", "/"},
		{"evil.example", "/"},
		{"?q=1", "/"},
		{"/é", "/"},
		{"/\x7f", "/"},
	}
	for _, tt := range tests {
		if got := localPath(tt.in); got != tt.want {
			t.Errorf("localPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestRedirectTargets(t *testing.T) {
	const host = "s-abc-8080.preview.example.com"
	tests := []struct {
		name, target, referer, want string
	}{
		{"token on root", "/?sandwake_token=swt_x", "", "/"},
		{"token among others", "/files/x?a=1&sandwake_token=swt_x&b=2", "", "/files/x?a=1&b=2"},
		{"double slash", "//evil.example/x?sandwake_token=swt_x", "", "/"},
		{"triple slash", "///evil.example/x?sandwake_token=swt_x", "", "/"},
		{"backslash", "/\\evil.example/x?sandwake_token=swt_x", "", "/%5Cevil.example/x"},
		{"encoded slashes stay a path", "/%2F%2Fevil.example/x?sandwake_token=swt_x", "", "/%2F%2Fevil.example/x"},
		{"encoded tab", "/%09/evil.example?sandwake_token=swt_x", "", "/%09/evil.example"},
		{"referer page", "", "http://" + host + "/files/x?a=1", "/files/x?a=1"},
		{"referer double slash", "", "http://" + host + "//evil.example/x", "/"},
		{"referer triple slash", "", "http://" + host + "///evil.example/x", "/"},
		{"referer backslash", "", "http://" + host + "/\\evil.example/x", "/%5Cevil.example/x"},
		{"referer encoded slashes", "", "http://" + host + "/%2F%2Fevil.example", "/%2F%2Fevil.example"},
		{"referer encoded tab", "", "http://" + host + "/%09/evil.example", "/%09/evil.example"},
		{"referer raw tab", "", "http://" + host + "/\t/evil.example", "/"},
		{"referer other host", "", "http://evil.example/x", "/"},
		{"no referer", "", "", "/"},
	}
	for _, tt := range tests {
		var got string
		if tt.target != "" {
			r := httptest.NewRequest("GET", "http://"+host+tt.target, nil)
			got = withoutToken(r)
		} else {
			r := httptest.NewRequest("POST", "http://"+host+pathWake, nil)
			r.Header.Set("Referer", tt.referer)
			got = backTo(r)
		}
		if got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
		// What the browser receives, through http.Redirect.
		w := httptest.NewRecorder()
		http.Redirect(w, httptest.NewRequest("GET", "http://"+host+"/", nil), got, http.StatusSeeOther)
		if loc := w.Header().Get("Location"); localPath(loc) != loc || loc == "" {
			t.Errorf("%s: Location %q leaves the host", tt.name, loc)
		}
	}
}
