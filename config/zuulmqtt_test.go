package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseZuulMQTT(t *testing.T) {
	tests := []struct {
		name string
		text string
		want *ZuulMQTT
	}{
		{"absent", "builder:\n  keep-builds: 2\n", nil},
		{"empty: absent", "builder:\n  zuul-mqtt:\n", nil},
		{"plain, defaults", "builder:\n  zuul-mqtt:\n    url: mqtt://mqtt.example.com\n",
			&ZuulMQTT{URL: "mqtt://mqtt.example.com:1883", Host: "mqtt.example.com", Port: 1883, Topics: []string{"zuul/#"}}},
		{"TLS default port, upper-case scheme, a slash", "builder:\n  zuul-mqtt:\n    url: MQTTS://mqtt.example.com/\n",
			&ZuulMQTT{URL: "mqtts://mqtt.example.com:8883", Host: "mqtt.example.com", Port: 8883, TLS: true, Topics: []string{"zuul/#"}}},
		{"everything", `builder:
  zuul-mqtt:
    url: mqtts://[2001:db8::1]:8884
    topics: ['zuul/+/post/#', 'zuul/+/periodic/#', 'zuul/+/post/#', 'zuul//x']
    username: nodepool
    password-file: /etc/nodepool/mqtt.pw
    ca-cert: /etc/nodepool/mqtt-ca.pem
    client-cert: /etc/nodepool/mqtt.crt
    client-key: /etc/nodepool/mqtt.key
`, &ZuulMQTT{URL: "mqtts://[2001:db8::1]:8884", Host: "2001:db8::1", Port: 8884, TLS: true,
			Topics:   []string{"zuul/+/post/#", "zuul/+/periodic/#", "zuul//x"},
			Username: "nodepool", PasswordFile: "/etc/nodepool/mqtt.pw",
			CACert: "/etc/nodepool/mqtt-ca.pem", ClientCert: "/etc/nodepool/mqtt.crt", ClientKey: "/etc/nodepool/mqtt.key"}},
		{"a username alone", "builder:\n  zuul-mqtt:\n    url: mqtt://127.0.0.1:1884\n    username: nodepool\n    topics: ['#']\n",
			&ZuulMQTT{URL: "mqtt://127.0.0.1:1884", Host: "127.0.0.1", Port: 1884, Topics: []string{"#"}, Username: "nodepool"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, head+tt.text)
			if !reflect.DeepEqual(cfg.Builder.ZuulMQTT, tt.want) {
				t.Errorf("builder.zuul-mqtt = %+v, want %+v", cfg.Builder.ZuulMQTT, tt.want)
			}
		})
	}
}

func TestParseZuulMQTTErrors(t *testing.T) {
	const sec = head + "builder:\n  zuul-mqtt:\n" // the section's keys start on line 4
	tests := []struct {
		name string
		text string
		line int
		path string
		msg  string
	}{
		{"not a mapping", head + "builder:\n  zuul-mqtt: mqtt://m\n", 3, "builder.zuul-mqtt", "expected the zuul-mqtt section"},
		{"unknown key", sec + "    url: mqtt://m\n    password: x\n", 5, "builder.zuul-mqtt.password", "unknown key in the zuul-mqtt section; known keys are url, topics, username, password-file"},
		{"no url", sec + "    username: u\n", 4, "builder.zuul-mqtt.url", "is required; set it to Zuul's MQTT broker, e.g. mqtts://"},
		{"http url", sec + "    url: https://m/\n", 4, "builder.zuul-mqtt.url", `"https://m/" is not an mqtt:// or mqtts:// URL`},
		{"no scheme", sec + "    url: mqtt.example.com:1883\n", 4, "builder.zuul-mqtt.url", "is not an mqtt:// or mqtts:// URL"},
		{"opaque", sec + "    url: 'mqtt:m'\n", 4, "builder.zuul-mqtt.url", "is not an mqtt:// or mqtts:// URL"},
		{"url a list", sec + "    url: [mqtt://m]\n", 4, "builder.zuul-mqtt.url", "expected a string, not a list"},
		{"userinfo", sec + "    url: mqtt://nodepool:s3cret@m/\n", 4, "builder.zuul-mqtt.url", "put the user name in username and the password in a file named by password-file"},
		{"user only", sec + "    url: mqtt://nodepool@m/\n", 4, "builder.zuul-mqtt.url", "holds a user name or password"},
		{"path", sec + "    url: mqtt://m/zuul/#\n", 4, "builder.zuul-mqtt.url", "has a path, query or fragment"},
		{"query", sec + "    url: mqtt://m?topic=zuul\n", 4, "builder.zuul-mqtt.url", "has a path, query or fragment"},
		{"no host", sec + "    url: mqtt://:1883\n", 4, "builder.zuul-mqtt.url", "names no host"},
		{"port zero", sec + "    url: mqtt://m:0\n", 4, "builder.zuul-mqtt.url", "the port must be a TCP port number from 1 to 65535"},
		{"port too big", sec + "    url: mqtt://m:70000\n", 4, "builder.zuul-mqtt.url", "the port must be a TCP port number"},
		{"empty port", sec + "    url: 'mqtt://m:'\n", 4, "builder.zuul-mqtt.url", "has an empty port"},
		{"topics a string", sec + "    url: mqtt://m\n    topics: zuul\n", 5, "builder.zuul-mqtt.topics", "expected a list of MQTT topic filters like ['zuul/#']"},
		{"topics empty", sec + "    url: mqtt://m\n    topics: []\n", 5, "builder.zuul-mqtt.topics", "lists no topic"},
		{"topic empty", sec + "    url: mqtt://m\n    topics: ['']\n", 5, "builder.zuul-mqtt.topics[0]", "is empty"},
		{"topic a number", sec + "    url: mqtt://m\n    topics: [1]\n", 5, "builder.zuul-mqtt.topics[0]", "expected a topic filter like 'zuul/#'"},
		{"topic a lone unquoted #", sec + "    url: mqtt://m\n    topics:\n      - zuul/#\n      - #\n", 7, "builder.zuul-mqtt.topics[1]", "not an empty value"},
		{"# not last", sec + "    url: mqtt://m\n    topics: ['zuul/#/post']\n", 5, "builder.zuul-mqtt.topics[0]", "# stands only for a whole last level"},
		{"# in a level", sec + "    url: mqtt://m\n    topics: ['zuul/a#']\n", 5, "builder.zuul-mqtt.topics[0]", "# stands only for a whole last level"},
		{"+ in a level", sec + "    url: mqtt://m\n    topics: ['zuul/ten+ant/#']\n", 5, "builder.zuul-mqtt.topics[0]", "+ stands only for one whole level"},
		{"second topic bad", sec + "    url: mqtt://m\n    topics:\n      - 'zuul/#'\n      - 'zuul/+x'\n", 7, "builder.zuul-mqtt.topics[1]", "+ stands only"},
		{"control character", sec + "    url: mqtt://m\n    topics: [\"zuul/\\x01\"]\n", 5, "builder.zuul-mqtt.topics[0]", "holds a control character"},
		{"password-file without username", sec + "    url: mqtt://m\n    password-file: /p\n", 5, "builder.zuul-mqtt.password-file", "is set without username"},
		{"client-cert alone", sec + "    url: mqtts://m\n    client-cert: /c\n", 5, "builder.zuul-mqtt.client-cert", "is set without client-key; give both"},
		{"client-key alone", sec + "    url: mqtts://m\n    client-key: /k\n", 5, "builder.zuul-mqtt.client-key", "is set without client-cert"},
		{"ca-cert on plain mqtt", sec + "    url: mqtt://m\n    ca-cert: /ca\n", 5, "builder.zuul-mqtt.ca-cert", "is for TLS, which an mqtt:// url does not use"},
		{"client cert on plain mqtt", sec + "    url: mqtt://m\n    client-cert: /c\n    client-key: /k\n", 6, "builder.zuul-mqtt.client-key", "is for TLS"},
		{"username a number", sec + "    url: mqtt://m\n    username: 12\n", 5, "builder.zuul-mqtt.username", "quote it if it is meant as text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parse(tt.text)
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want an error", cfg.Builder.ZuulMQTT)
			}
			wantError(t, err, tt.line, tt.path, tt.msg)
		})
	}
}

// A password written into the url, by mistake, is not repeated by the error
// that says where it belongs, nor by one about the rest of the url.
func TestParseZuulMQTTErrorsHideThePassword(t *testing.T) {
	for _, u := range []string{"mqtt://nodepool:s3cret@m/", "mqtts://nodepool:s3cret@m:8883/zuul?x=1", "http://nodepool:s3cret@m/", "mqtt://nodepool:s3cret@m:99999/"} {
		_, err := parse(head + "builder:\n  zuul-mqtt:\n    url: '" + u + "'\n")
		if err == nil {
			t.Fatalf("url %s: Parse succeeded", u)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("url %s: the error shows the password: %v", u, err)
		}
	}
}
