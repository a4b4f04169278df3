GO ?= go
BIN := bin/nodepool-builder

# What --version prints, and what the package and the image are named with:
# git describe as a Debian version (scripts/version.sh says how), and the
# commit of the checkout. Outside a git checkout both are empty, and the
# binary says what Go recorded instead.
VERSION ?= $(shell sh scripts/version.sh)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.buildVersion=$(VERSION) -X main.buildCommit=$(COMMIT)

# The binary the package and the image ship: without cgo, so that it needs no
# C library (its SQLite driver is Go); position-independent, as Debian builds
# its programs (it needs the dynamic loader alone, which every Debian has);
# stripped, and without the build's paths.
STATIC := bin/static/nodepool-builder
DEB_ARCH ?= $(shell dpkg --print-architecture 2>/dev/null || $(GO) env GOARCH)
DEB := dist/nodepool-builder_$(VERSION)_$(DEB_ARCH).deb
# An image tag takes neither ~ nor +: 0.0.0~git... is tagged 0.0.0-git...
IMAGE := nodepool-builder:$(subst +,-,$(subst ~,-,$(VERSION)))

.PHONY: all build static deb image package-test deps deps-test test vet race stress bench demo clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/nodepool-builder

static:
	CGO_ENABLED=0 $(GO) build -trimpath -buildmode=pie -ldflags "-s -w $(LDFLAGS)" -o $(STATIC) ./cmd/nodepool-builder

# deb builds dist/nodepool-builder_<version>_<arch>.deb with dpkg-deb
# (scripts/deb.sh, packaging/debian).
deb: static
	rm -f dist/nodepool-builder_*.deb
	sh scripts/deb.sh "$(VERSION)" "$(DEB_ARCH)" $(STATIC) dist

# image builds the OCI image nodepool-builder:<version> (and :latest) with
# podman from the Containerfile; without a registry, its Debian base is made
# with mmdebstrap (scripts/image.sh). podman keeps the layers, Debian's
# packages included: make image IMAGE_BUILD_FLAGS=--no-cache takes their updates.
image: static
	sh scripts/image.sh "$(VERSION)" "$(IMAGE)" $(IMAGE_BUILD_FLAGS)

# deps installs the real parts the demo runs (Glance, qemu-img, zstd) when they
# are missing; deps-test adds diskimage-builder for the real DIB build test,
# ZooKeeper (with java) and kazoo, an independent client the tests check against,
# and gearmand with the gearman command, the client the gearman tests call.
deps:
	sh scripts/deps.sh demo

deps-test:
	sh scripts/deps.sh test

vet:
	$(GO) vet ./...

# test runs every test under the race detector, integration tests against the
# real parts included (the daemons the end-to-end tests start are instrumented
# too). Under CI=true a missing part fails the run instead of skipping.
# scripts/test.sh runs the longest end-to-end tests in a go test process of
# their own beside the rest, since they mostly wait on the parts they start.
test: deps-test vet
	GO=$(GO) sh scripts/test.sh -race -count=1 -timeout 40m
	$(MAKE) package-test

# package-test builds the package and the image and tests them as an operator
# uses them (packaging/, under the packaging build tag): lintian checks the
# package; as root, it is installed on this machine, run --once as the
# nodepool user against a stand-in Zuul and a Glance, upgraded, removed and
# purged, and the machine is put back as it was; the image is run --once with
# podman against the same, and privileged to build a diskimage; the package
# is run under systemd, PID 1 of a podman container, with the unit's sandbox
# and the DIB drop-in. The first run here builds the image's base and the
# systemd container's (a minute or two each); podman keeps them.
# Images of earlier test runs, untagged once tested, are pruned so that a
# machine running the tests at each commit keeps one image, :latest.
package-test: deps-test deb image
	PACKAGE_DEB=$(CURDIR)/$(DEB) PACKAGE_IMAGE=$(IMAGE) $(GO) test -tags packaging -count=1 -timeout 20m ./packaging/
	-podman untag $(IMAGE) $(IMAGE)
	-podman image prune -f --filter label=org.opencontainers.image.title=nodepool-builder >/dev/null

# race is a quick run of the packages with concurrent code under the race
# detector; -short and -skip leave out their slow integration tests (the real
# DIB build, a 256 MiB download), which test covers.
race:
	$(GO) test -race -short -skip 'TestReal' -count=1 ./store/... ./builder/ ./uploader/... ./poller/ ./dib/ ./artifacts/ ./qemuimg/ ./source/ ./zuulapi/... ./gearman/

# stress hunts tests that pass only on an idle machine: it runs the fast
# packages' tests N times (default 10) under the race detector with -short,
# while busy processes it starts and stops keep all CPUs but one loaded.
# cmd/nodepool-builder, whose tests take minutes, is left out; make test runs
# it. One package, more often: make stress N=50 STRESS_PKGS=./artifacts/
N ?= 10
STRESS_PKGS ?= ./artifacts/ ./builder/ ./config/ ./dib/ ./gearman/ ./internal/... \
	./listing/ ./metrics/... ./poller/ ./progress/ ./qemuimg/ ./source/ ./state/ ./status/ ./store/... \
	./uploader/... ./webapp/ ./zuulapi/...

stress: deps-test
	GO=$(GO) sh scripts/stress.sh $(N) $(STRESS_PKGS)

# bench first sets the two steps every image goes through beside the simplest
# tool that does the same work, five repetitions each, and prints the median of
# the ratios: a fetch of a 1 GiB image served as .zst against md5sum of the
# image, an upload of it to Glance against curl -T (about two minutes). Then it
# shows that memory stays flat whatever the image size, that a reconcile step
# over 19,000 uploads in ZooKeeper reads no znode, beside a full read of them
# (store/zookeeper: about two minutes, most of it populating), and the time of a
# --once with nothing to do over 500 zuul-images and 2 providers. Then the
# ZooKeeper mode (TLS) at scale, 500 zuul-images × 20 providers and three
# builders: a --once with nothing to do and a daemon's steady-state pass with
# the three running, beside one client's full read of the tree (about two
# minutes). Then how long a new Zuul build waits for its download: reported
# over MQTT, beside polling alone at the default 60 s (about five minutes, most
# of it waiting for the polls). Last, from a Zuul build's MQTT report to its
# 512 MiB image active in three Glances, the artifact server capped at 12 MiB/s
# and each Glance's link at 24 MiB/s, beside fetching alone and uploading alone
# with curl and zstd through the same caps (about five minutes).
bench:
	$(GO) test -run '^$$' -bench 'BenchmarkFetchZst$$|BenchmarkUploadVsCurl$$' -benchtime 5x -benchmem ./artifacts/ ./uploader/
	$(GO) test -run '^$$' -bench 'BenchmarkFetch$$|BenchmarkFetchRanges|BenchmarkUpload$$|BenchmarkZooKeeperStep' -benchmem \
		./artifacts/ ./uploader/... ./store/zookeeper/
	$(GO) test -run '^$$' -bench BenchmarkOnceNoOp -benchtime 5x ./cmd/nodepool-builder/
	$(GO) test -run '^$$' -bench BenchmarkZooKeeperNoOp -benchtime 3x -timeout 30m ./cmd/nodepool-builder/
	$(GO) test -run '^$$' -bench BenchmarkNewBuildLatency -benchtime 5x -timeout 30m ./cmd/nodepool-builder/
	$(GO) test -run '^$$' -bench BenchmarkReportToActive -benchtime 3x -timeout 30m ./cmd/nodepool-builder/

# demo runs the main job end to end on this machine: a throwaway Glance, a
# stand-in Zuul serving small generated images, one --once run, image-list.
demo: deps build
	$(GO) run ./examples/demo -builder $(BIN)

clean:
	rm -rf bin dist
