package testenv

import (
	"bufio"
	"context"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// subscribe starts mosquitto_sub on topic, an independent client, and returns
// its lines; it ends with the test.
func subscribe(t *testing.T, m *Mosquitto, topic string, args ...string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	base := []string{"-h", m.Host, "-p", strconv.Itoa(m.Port), "-t", topic, "-v"}
	if m.TLS {
		base = append(base, "--cafile", m.CA, "-u", m.Username, "-P", m.Password)
		if m.ClientCert != "" {
			base = append(base, "--cert", m.ClientCert, "--key", m.ClientKey)
		}
	}
	cmd := exec.CommandContext(ctx, RequireBinary(t, "mosquitto_sub"), append(base, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto_sub: %v", err)
	}
	lines := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		cmd.Wait()
	})
	return lines
}

// waitLine publishes until the subscriber prints want: mosquitto_sub gives no
// sign that its subscription is in place, so the first messages may find none.
func waitLine(t *testing.T, m *Mosquitto, lines <-chan string, topic, msg string) {
	t.Helper()
	want := topic + " " + msg
	deadline := time.After(20 * time.Second)
	for {
		m.Publish(t, topic, []byte(msg))
		select {
		case l := <-lines:
			if l == want {
				return
			}
			t.Fatalf("mosquitto_sub printed %q, want %q", l, want)
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("mosquitto_sub never printed %q\nbroker log:\n%s", want, logTail(m.LogFile))
		}
	}
}

// TestMosquittoPlainStopStart passes a message through the broker between two
// independent clients, then stops it and starts it again on the same port.
func TestMosquittoPlainStopStart(t *testing.T) {
	m := NewMosquitto(t, MosquittoOptions{})
	if !strings.HasPrefix(m.URL, "mqtt://127.0.0.1:") {
		t.Errorf("URL = %q, want mqtt://127.0.0.1:port", m.URL)
	}
	lines := subscribe(t, m, "zuul/#")
	waitLine(t, m, lines, "zuul/tenant/post", "hello")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := m.Addr
	if err := m.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Stop", addr)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatalf("start after stop: %v", err)
	}
	if m.Addr != addr {
		t.Fatalf("restarted on %s, want %s", m.Addr, addr)
	}
	if err := m.Start(ctx); err == nil {
		t.Errorf("Start of a running broker succeeded")
	}
	lines = subscribe(t, m, "zuul/#")
	waitLine(t, m, lines, "zuul/tenant/post", "again")
	if err := m.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatalf("start after kill: %v", err)
	}
}

// TestMosquittoTLS lets in a client that trusts the test CA and logs in with
// the test user's password (and client certificate), and no other.
func TestMosquittoTLS(t *testing.T) {
	for _, clientCert := range []bool{false, true} {
		t.Run("client cert "+strconv.FormatBool(clientCert), func(t *testing.T) {
			m := NewMosquitto(t, MosquittoOptions{TLS: true, ClientCert: clientCert})
			if !strings.HasPrefix(m.URL, "mqtts://127.0.0.1:") || m.Username == "" || m.Password == "" {
				t.Fatalf("URL %q, user %q, password %q: want mqtts:// and a user with a password", m.URL, m.Username, m.Password)
			}
			if (m.ClientCert != "") != clientCert {
				t.Errorf("ClientCert = %q with ClientCert %t", m.ClientCert, clientCert)
			}
			lines := subscribe(t, m, "zuul/#")
			waitLine(t, m, lines, "zuul/t", "over TLS")

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			refused := map[string][]string{
				"a wrong password": {"-P", "wrong"},
				"no TLS":           {"-h", m.Host, "-p", strconv.Itoa(m.Port), "-u", m.Username, "-P", m.Password},
			}
			for what, args := range refused {
				var cmd *exec.Cmd
				if what == "no TLS" {
					cmd = exec.CommandContext(ctx, "mosquitto_pub", append(args, "-t", "zuul/t", "-m", "x", "-q", "1")...)
				} else {
					cmd = m.PubCommand(ctx, append(args, "-t", "zuul/t", "-m", "x", "-q", "1")...)
				}
				out, err := cmd.CombinedOutput()
				if err == nil {
					t.Errorf("mosquitto_pub with %s succeeded: %s", what, out)
				} else if what == "a wrong password" && !strings.Contains(string(out), "not authorised") {
					t.Errorf("mosquitto_pub with %s: %v: %s; want the broker to refuse the login", what, err, out)
				}
			}
		})
	}
}
