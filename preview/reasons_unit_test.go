package preview

import "testing"

func TestReasonSentence(t *testing.T) {
	tests := []struct{ code, want string }{
		{"image_missing", reasonSentences["image_missing"]},
		{"exited(137)", reasonSentences["exited"]},
		{"oom", reasonSentences["oom"]},
		{"", reasonSentenceUnknown},
		{"something_new", reasonSentenceUnknown},
		{"(", reasonSentenceUnknown},
	}
	for _, tt := range tests {
		if got := reasonSentence(tt.code); got != tt.want {
			t.Errorf("reasonSentence(%q) = %q, want %q", tt.code, got, tt.want)
		}
	}
	for code, s := range reasonSentences {
		if s == "" || s[len(s)-1] != '.' {
			t.Errorf("sentence of %s is not a sentence: %q", code, s)
		}
	}
}
