package zookeeper

import (
	"errors"
	"testing"
	"time"
)

// TestUnreachable: an Open without a session says which servers, how long it
// waited and, when known, why the last connection failed.
func TestUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name, last, want string
	}{
		{"no reason", "", "ZooKeeper cannot be reached: no session with zk1:2181, zk2:2181 within 10s; " +
			"check zookeeper-servers and zookeeper-tls, and that the cluster runs"},
		{"last reason", "dial tcp: connection refused", "ZooKeeper cannot be reached: no session with zk1:2181, zk2:2181 within 10s " +
			"(last: dial tcp: connection refused); check zookeeper-servers and zookeeper-tls, and that the cluster runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := unreachable([]string{"zk1:2181", "zk2:2181"}, 10*time.Second, tc.last)
			if err.Error() != tc.want {
				t.Errorf("unreachable = %q\nwant %q", err, tc.want)
			}
			if !errors.Is(err, ErrUnreachable) {
				t.Error("unreachable does not wrap ErrUnreachable")
			}
		})
	}
}
