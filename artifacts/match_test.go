package artifacts

import (
	"errors"
	"slices"
	"testing"
)

func zuulImage(name, format, url string) Candidate {
	return Candidate{Name: name, URL: url, Metadata: map[string]any{
		"type": "zuul_image", "image_name": "debian", "format": format,
		"sha256": "ABC", "md5sum": "def",
	}}
}

func TestMatch(t *testing.T) {
	conventional := []Candidate{
		{Name: "Zuul Manifest", URL: "https://logs/zuul-manifest.json", Metadata: map[string]any{"type": "zuul_manifest"}},
		zuulImage("qcow2 image", "qcow2", "https://logs/debian.qcow2"),
		zuulImage("raw image", "raw", "https://logs/debian.raw.zst"),
		zuulImage("second raw", "raw", "https://logs/other.raw"),
		{Name: "no metadata", URL: "https://logs/x"},
	}
	mapped := []Candidate{
		{Name: "qcow image", URL: "https://logs/a.qcow2", Metadata: map[string]any{"type": "image-qcow"}},
		{Name: "raw image", URL: "https://logs/a.raw", Metadata: map[string]any{"type": "image-raw"}},
		{Name: "raw debug image", URL: "https://logs/a-debug.raw", Metadata: map[string]any{"type": "image-raw"}},
		{Name: "vhd", URL: "https://logs/a.vhd", Metadata: map[string]any{"type": 7}},
	}
	mappings := []Mapping{
		{Format: "qcow", Type: "image-qcow"},
		{Format: "raw", Type: "image-raw", Name: "raw debug image"},
		{Format: "vhd", Type: "image-vhd"},
	}

	tests := []struct {
		name      string
		cands     []Candidate
		mappings  []Mapping
		formats   []string
		want      map[string]string // format -> URL
		missing   []string
		available []string
	}{
		{
			name: "convention", cands: conventional, formats: []string{"qcow2", "raw"},
			want: map[string]string{"qcow2": "https://logs/debian.qcow2", "raw": "https://logs/debian.raw.zst"},
		},
		{
			name: "qcow means qcow2", cands: conventional, formats: []string{"qcow", "QCOW2"},
			want: map[string]string{"qcow2": "https://logs/debian.qcow2"},
		},
		{
			name: "convention missing vhd", cands: conventional, formats: []string{"vhd", "raw"},
			want:    map[string]string{"raw": "https://logs/debian.raw.zst"},
			missing: []string{"vhd"}, available: []string{"qcow2", "raw"},
		},
		{
			name: "mapping by type and name", cands: mapped, mappings: mappings, formats: []string{"qcow2", "raw"},
			want: map[string]string{"qcow2": "https://logs/a.qcow2", "raw": "https://logs/a-debug.raw"},
		},
		{
			name: "mapping ignores convention", cands: conventional, mappings: mappings, formats: []string{"qcow2"},
			want: map[string]string{}, missing: []string{"qcow2"}, available: nil,
		},
		{
			name: "mapping missing vhd", cands: mapped, mappings: mappings, formats: []string{"vhd"},
			want: map[string]string{}, missing: []string{"vhd"}, available: []string{"qcow2", "raw"},
		},
		{
			name: "no formats wanted", cands: conventional, formats: nil, want: map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Match(tt.cands, tt.mappings, tt.formats)
			gotURLs := map[string]string{}
			for f, c := range got {
				gotURLs[f] = c.URL
			}
			if len(gotURLs) != len(tt.want) {
				t.Errorf("Match = %v, want %v", gotURLs, tt.want)
			}
			for f, u := range tt.want {
				if gotURLs[f] != u {
					t.Errorf("Match[%s] = %q, want %q", f, gotURLs[f], u)
				}
			}
			if tt.missing == nil {
				if err != nil {
					t.Fatalf("Match error: %v", err)
				}
				return
			}
			var me *MissingError
			if !errors.As(err, &me) {
				t.Fatalf("Match error = %v, want *MissingError", err)
			}
			if !slices.Equal(me.Missing, tt.missing) || !slices.Equal(me.Available, tt.available) {
				t.Errorf("MissingError = %+v, want missing %v available %v", me, tt.missing, tt.available)
			}
		})
	}
}

func TestMissingErrorMessage(t *testing.T) {
	tests := []struct {
		err  MissingError
		want string
	}{
		{MissingError{Missing: []string{"raw"}, Available: []string{"qcow2"}},
			"no artifact for format raw: the build publishes only qcow2"},
		{MissingError{Missing: []string{"raw", "vhd"}},
			"no artifact for format raw, vhd: the build publishes no image format"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestAvailable(t *testing.T) {
	cands := []Candidate{
		zuulImage("r", "raw", "u1"),
		zuulImage("q", "qcow", "u2"),
		zuulImage("r2", "raw", "u3"),
		{Name: "other", Metadata: map[string]any{"type": "logs", "format": "vhd"}},
	}
	if got, want := Available(cands, nil), []string{"qcow2", "raw"}; !slices.Equal(got, want) {
		t.Errorf("Available = %v, want %v", got, want)
	}
	m := []Mapping{{Format: "vhd", Type: "logs"}, {Format: "raw", Type: "nothing"}}
	if got, want := Available(cands, m), []string{"vhd"}; !slices.Equal(got, want) {
		t.Errorf("Available with mappings = %v, want %v", got, want)
	}
}

func TestChecksums(t *testing.T) {
	tests := []struct {
		meta           map[string]any
		sha256, md5sum string
	}{
		{map[string]any{"sha256": " ABCdef ", "md5sum": "0123"}, "abcdef", "0123"},
		{map[string]any{"sha256": 12}, "", ""},
		{nil, "", ""},
	}
	for _, tt := range tests {
		s, m := Checksums(Candidate{Metadata: tt.meta})
		if s != tt.sha256 || m != tt.md5sum {
			t.Errorf("Checksums(%v) = %q, %q, want %q, %q", tt.meta, s, m, tt.sha256, tt.md5sum)
		}
	}
}

func TestCompression(t *testing.T) {
	tests := []struct{ url, want string }{
		{"https://logs.example/debian.raw.zst", "zst"},
		{"https://logs.example/debian.raw.ZST?temp_url_sig=abc&x=.gz", "zst"},
		{"https://logs.example/debian.vhd.gz#frag", "gz"},
		{"https://logs.example/debian.qcow2", ""},
		{"https://logs.example/debian.qcow2?name=x.zst", ""},
		{"https://logs.example/zst", ""},
		{"debian.raw.gz", "gz"},
		{"http://bad host/%zz.gz?x", "gz"},
	}
	for _, tt := range tests {
		if got := Compression(tt.url); got != tt.want {
			t.Errorf("Compression(%q) = %q, want %q", tt.url, got, tt.want)
		}
	}
}
