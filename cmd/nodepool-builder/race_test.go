package main

import (
	"strings"
	"testing"
)

// zkRace is the known race of go-zookeeper's reconnect, as a child reported it.
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

func TestRaceReportsLeaveOnlyZooKeepersKnownRace(t *testing.T) {
	logs := "time=... msg=\"ZooKeeper connection back\"\n" + zkRace + "time=... msg=\"upload ready\"\n"
	if races, known := raceReports(logs); len(races) != 0 || known != 1 {
		t.Errorf("the known race: %d reports, %d known; want 0, 1", len(races), known)
	}
	races, known := raceReports(zkRace + ourRace)
	if len(races) != 1 || known != 1 || !strings.Contains(races[0], "builder.(*Builder).plan()") {
		t.Errorf("a race of ours beside the known one: reports %q, %d known; want ours alone reported", races, known)
	}
	if races, _ := raceReports("no race here\n"); len(races) != 0 {
		t.Errorf("clean output: %q", races)
	}
}
