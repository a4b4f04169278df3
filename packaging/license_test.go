package packaging

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// apacheLicense is where Debian keeps the text of the Apache License 2.0.
const apacheLicense = "/usr/share/common-licenses/Apache-2.0"

// TestLicense: the project is under the Apache License 2.0, as nodepool and
// Zuul are: LICENSE at the root holds its text, and the package's copyright
// file, in Debian's machine-readable format, names it for the project's files
// and for nodepool's in third_party/.
func TestLicense(t *testing.T) {
	license := mustRead(t, filepath.Join("..", "LICENSE"))
	if !bytes.Contains(license, []byte("Apache License\n                           Version 2.0, January 2004")) ||
		!bytes.Contains(license, []byte("END OF TERMS AND CONDITIONS")) {
		t.Errorf("LICENSE is not the text of the Apache License 2.0")
	}
	if debian, err := os.ReadFile(apacheLicense); err == nil && !bytes.Equal(license, debian) {
		t.Errorf("LICENSE differs from %s, the license's text", apacheLicense)
	}
	if vendored := mustRead(t, filepath.Join("..", "third_party", "nodepool", "LICENSE")); !bytes.Equal(license, vendored) {
		t.Errorf("third_party/nodepool/LICENSE is not the Apache License 2.0 this project is under")
	}

	stanzas := dep5(t, string(mustRead(t, filepath.Join("debian", "copyright"))))
	if len(stanzas) == 0 || !strings.HasPrefix(stanzas[0]["Format"], "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0") {
		t.Fatalf("debian/copyright does not start with the Format of Debian's machine-readable copyright")
	}
	files := map[string]string{} // Files pattern: its License
	texts := map[string]bool{}   // licenses whose text a stanza of their own holds
	for _, s := range stanzas[1:] {
		switch {
		case s["Files"] != "":
			if s["Copyright"] == "" {
				t.Errorf("debian/copyright: Files %s has no Copyright", s["Files"])
			}
			files[s["Files"]] = s["License"]
		case s["License"] != "":
			name, text, _ := strings.Cut(s["License"], "\n")
			texts[name] = strings.TrimSpace(text) != ""
		}
	}
	for pattern, want := range map[string]string{"*": "Apache-2.0", "third_party/nodepool/*": "Apache-2.0"} {
		if got := files[pattern]; got != want {
			t.Errorf("debian/copyright: Files %s: License %q, want %s", pattern, got, want)
		}
	}
	for _, name := range files {
		if !strings.Contains(name, "\n") && !texts[name] {
			t.Errorf("debian/copyright: license %s has no stanza with its text", name)
		}
	}
}

// dep5 reads the stanzas of a machine-readable copyright file: fields by
// name, a continued value's lines joined with newlines.
func dep5(t *testing.T, text string) []map[string]string {
	t.Helper()
	var stanzas []map[string]string
	for para := range strings.SplitSeq(strings.TrimSpace(text), "\n\n") {
		s := map[string]string{}
		var last string
		for line := range strings.SplitSeq(para, "\n") {
			if strings.HasPrefix(line, " ") && last != "" {
				s[last] += "\n" + strings.TrimSpace(line)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				t.Fatalf("debian/copyright: %q is neither a field nor a continuation", line)
			}
			last = k
			s[k] = strings.TrimSpace(v)
		}
		stanzas = append(stanzas, s)
	}
	return stanzas
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
