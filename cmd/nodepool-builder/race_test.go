package main

import (
	"strings"
	"testing"
)

// zkRace is a race in the ZooKeeper client library (go-zookeeper/zk v1.0.4's
// unsynchronised last zxid on a reconnect), as a child reported it.
const zkRace = `==================
WARNING: DATA RACE
Write at 0x00c000164480 by goroutine 72:
  github.com/go-zookeeper/zk.(*Conn).recvLoop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:849 +0x68c
  github.com/go-zookeeper/zk.(*Conn).loop.func2()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:474 +0x1c4

Previous read at 0x00c000164480 by goroutine 16:
  github.com/go-zookeeper/zk.(*Conn).sendSetWatches()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:614 +0x49d
  github.com/go-zookeeper/zk.(*Conn).loop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:484 +0x54b

Goroutine 16 (running) created at:
  github.com/go-zookeeper/zk.Connect()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:223 +0x8e6
  github.com/nodepool-builder/nodepool-builder/store/zookeeper.Open()
      /src/store/zookeeper/zookeeper.go:135 +0xdd7
==================
`

// ourRace is a race in our own code.
const ourRace = `==================
WARNING: DATA RACE
Write at 0x00c000164480 by goroutine 72:
  github.com/nodepool-builder/nodepool-builder/builder.(*Builder).plan()
      /src/builder/builder.go:10 +0x68c

Previous read at 0x00c000164480 by goroutine 16:
  github.com/go-zookeeper/zk.(*Conn).sendSetWatches()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:614 +0x49d
  github.com/go-zookeeper/zk.(*Conn).recvLoop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:849 +0x68c
==================
`

// TestRaceReports: every report in a child's output fails its test, the
// client library's included: the ZooKeeper client in use synchronises its
// last zxid, so a report there is news.
func TestRaceReports(t *testing.T) {
	logs := "time=... msg=\"ZooKeeper connection back\"\n" + zkRace + "time=... msg=\"upload ready\"\n"
	if races := raceReports(logs); len(races) != 1 || !strings.Contains(races[0], "zk.(*Conn).sendSetWatches()") {
		t.Errorf("a race in the ZooKeeper client: reports %q; want it", races)
	}
	races := raceReports(zkRace + ourRace)
	if len(races) != 2 || !strings.Contains(races[1], "builder.(*Builder).plan()") {
		t.Errorf("two races: reports %q; want both", races)
	}
	if races := raceReports("no race here\n"); len(races) != 0 {
		t.Errorf("clean output: %q", races)
	}
}
