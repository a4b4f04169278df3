package config

import (
	"slices"
	"strings"
	"testing"
)

// TestOwnSettingsChanged: the keys of the builder's own settings that differ
// between two configs, by path: a mapping's keys one by one, zuul-images by
// name whatever their order, any other value whole.
func TestOwnSettingsChanged(t *testing.T) {
	parse := func(own string) *Config {
		t.Helper()
		cfg, err := ParseFiles(Text{Name: "nodepool.yaml", Data: []byte(strings.Replace(pairNodepool, "providers:", "  - {name: ubuntu, pause: true}\nproviders:", 1))},
			&Text{Name: BuilderFileName, Data: []byte(own)}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ubuntu := "  - name: ubuntu\n    api-url: https://zuul.example.com/\n    project: org/images\n    job: build-ubuntu\n"
	base := strings.Replace(pairOwn, "builder:", ubuntu+"builder:", 1) +
		"  webapp: {port: 8006}\n  zuul-mqtt: {url: 'mqtts://mqtt.example.com', username: nodepool, password-file: /etc/nodepool/mqtt.pw}\n"
	running := parse(base)
	for _, c := range []struct {
		name, own string
		want      []string
	}{
		{"same", base, nil},
		{"zuul-images in another order", strings.Replace(strings.Replace(base, ubuntu, "", 1), "zuul-images:\n", "zuul-images:\n"+ubuntu, 1), nil},
		{"a nested key", strings.Replace(base, "port: 8006", "port: 8007", 1), []string{"builder.webapp.port"}},
		{"a section gone", strings.Replace(base, "  zuul-mqtt:", "  #", 1), []string{"builder.zuul-mqtt"}},
		{"a key of a zuul-image", strings.Replace(base, "job: build-ubuntu", "job: build-other", 1), []string{"zuul-images[ubuntu].job"}},
		{"a zuul-image gone", strings.Replace(base, ubuntu, "", 1), []string{"zuul-images[ubuntu]"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := running.OwnSettingsChanged(parse(c.own)); !slices.Equal(got, c.want) {
				t.Errorf("OwnSettingsChanged = %q, want %q", got, c.want)
			}
		})
	}
	// A config made in code rather than read has none: nothing differs.
	if got := (&Config{}).OwnSettingsChanged(&Config{}); got != nil {
		t.Errorf("configs not read: %q", got)
	}
}
