package config

import "testing"

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"pause", "pause", 0},
		{"", "name", 4},
		{"puase", "pause", 1},          // a swap of neighbours
		{"diskimage", "diskimages", 1}, // a letter missing
		{"elemnts", "elements", 1},
		{"image-fromat", "image-format", 1},
		{"keep-buidls", "keep-builds", 1},
		{"ssl", "host", 3},
		{"url", "type", 4},
		{"ça", "ca", 1}, // runes, not bytes
	}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := editDistance(tt.b, tt.a); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestNearestKey(t *testing.T) {
	provider := []string{"name", "driver", "cloud", "region-name", "image-format", "image-name-format", "diskimages", "pools"}
	tests := []struct {
		key   string
		known []string
		want  string // "" for no suggestion
	}{
		{"image_format", provider, "image-format"},                               // '_' for '-'
		{"Image-Format", provider, "image-format"},                               // case
		{"listen-address", []string{"port", "listen_address"}, "listen_address"}, // and '-' for '_'
		{"diskimage", provider, "diskimages"},
		{"clouds", provider, "cloud"},
		{"region_nmae", provider, "region-name"}, // '_' and a swap
		{"puase", []string{"name", "pause", "meta"}, "pause"},
		{"elemnts", []string{"name", "elements", "env-vars"}, "elements"},
		{"provider", []string{"labels", "providers", "diskimages"}, "providers"},
		// Too far for their length: no suggestion.
		{"ssl", []string{"host", "port"}, ""},
		{"url", []string{"format", "type", "name"}, ""},
		{"images", provider, ""},
		{"region", provider, ""},
		{"", provider, ""},
		// A tie goes to the first known key.
		{"bort", []string{"port", "sort"}, "port"},
	}
	for _, tt := range tests {
		got, ok := nearestKey(tt.key, tt.known)
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("nearestKey(%q) = %q, %v; want %q", tt.key, got, ok, tt.want)
		}
	}
}

func TestUnknownKeyMsg(t *testing.T) {
	known := []string{"host", "port"}
	if got, want := unknownKeyMsg("prot", "a gearman server", known), "unknown key in a gearman server; did you mean port?"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := unknownKeyMsg("ssl", "a gearman server", known), "unknown key in a gearman server; known keys are host, port"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
