package metrics

import (
	"maps"
	"slices"
	"sync"
)

// What nodepool's builder is doing with an image, as the values of its
// build.state and upload.state gauges (STATUS_* in nodepool 11's builder).
const (
	StatusIdle      = 0
	StatusBuilding  = 1
	StatusUploading = 2
	StatusPaused    = 3
)

// activity is the builds and uploads this process runs now, counted: two
// uploads of one image to one provider (of two builds) may overlap.
type activity struct {
	mu        sync.Mutex
	building  map[string]int
	uploading map[imageProvider]int
}

type imageProvider struct{ image, provider string }

// Building records that this process begins to make a build of image (a DIB
// build, the fetch of a Zuul build's files); done records that it ended,
// however it ended. Until then the image's build.state is StatusBuilding.
func (m *Metrics) Building(image string) (done func()) {
	if m == nil {
		return func() {}
	}
	return track(&m.act.mu, m.act.building, image)
}

// Uploading records that this process begins an upload of image to provider,
// its record made; done records that it ended, however it ended. Until then
// the upload.state of the image in the provider is StatusUploading.
func (m *Metrics) Uploading(image, provider string) (done func()) {
	if m == nil {
		return func() {}
	}
	return track(&m.act.mu, m.act.uploading, imageProvider{image, provider})
}

func track[K comparable](mu *sync.Mutex, counts map[K]int, k K) func() {
	mu.Lock()
	counts[k]++
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			if counts[k]--; counts[k] <= 0 {
				delete(counts, k)
			}
		})
	}
}

// ImageStates is what the builder knows of its images at one moment, from
// which nodepool 11's builder gauges are sent.
type ImageStates struct {
	// Images are the images the gauges are sent for: every image of the state
	// (nodepool's getImageNames), and this builder's own.
	Images []string
	// Paused are this builder's images whose builds are paused.
	Paused map[string]bool
	// Providers are, by image, the providers this builder uploads it to, each
	// true when it pauses the image's uploads.
	Providers map[string]map[string]bool
	// Requested are the images whose build request is pending: made, and
	// not yet taken by a build.
	Requested map[string]bool
}

// gauge is one statsd gauge.
type gauge struct {
	Name  string
	Value int64
}

// SendsStatsd tells whether statsd is on: SendImageStates sends nothing
// otherwise, and its ImageStates need not be read.
func (m *Metrics) SendsStatsd() bool { return m != nil && m.statsd != nil }

// SendImageStates sends nodepool 11's builder gauges in one batch, as its
// cleanup worker does on each pass; nothing when statsd is off.
func (m *Metrics) SendImageStates(s ImageStates) {
	if !m.SendsStatsd() {
		return
	}
	gauges := m.imageStateGauges(s)
	lines := make([]string, len(gauges))
	for i, g := range gauges {
		lines[i] = line(m.statsd.prefix, g.Name, g.Value, "g")
	}
	m.statsd.batch(lines)
}

// imageStateGauges are the gauges SendImageStates sends for s now, in
// nodepool's order: per image, sorted, its build.state, its upload.state per
// provider, sorted, and its image_build_requests; then image_build_requests
// of all images. An image is building while this process makes a build of
// it, else paused while its builds are, else idle; an upload state is that of
// this process's uploads alike. A build that failed leaves its image idle.
func (m *Metrics) imageStateGauges(s ImageStates) []gauge {
	m.act.mu.Lock()
	building := maps.Clone(m.act.building)
	uploading := maps.Clone(m.act.uploading)
	m.act.mu.Unlock()

	images := slices.Clone(s.Images)
	providers := map[string]map[string]int64{}
	for image, ps := range s.Providers {
		providers[image] = map[string]int64{}
		for p, paused := range ps {
			providers[image][p] = StatusIdle
			if paused {
				providers[image][p] = StatusPaused
			}
		}
	}
	// Work under way counts whatever the config says now: a reload may have
	// dropped what it is on.
	for image := range building {
		images = append(images, image)
	}
	for k := range uploading {
		images = append(images, k.image)
		if providers[k.image] == nil {
			providers[k.image] = map[string]int64{}
		}
		providers[k.image][k.provider] = StatusUploading
	}
	slices.Sort(images)
	images = slices.Compact(images)

	host := "nodepool.builder." + key(m.hostname) + ".image."
	var out []gauge
	var requests int64
	for _, image := range images {
		state := int64(StatusIdle)
		switch {
		case building[image] > 0:
			state = StatusBuilding
		case s.Paused[image]:
			state = StatusPaused
		}
		out = append(out, gauge{host + key(image) + ".build.state", state})
		for _, p := range slices.Sorted(maps.Keys(providers[image])) {
			out = append(out, gauge{host + key(image) + ".provider." + key(p) + ".upload.state", providers[image][p]})
		}
		var n int64
		if s.Requested[image] {
			n = 1
		}
		requests += n
		out = append(out, gauge{"nodepool.image." + key(image) + ".image_build_requests", n})
	}
	return append(out, gauge{"nodepool.image_build_requests", requests})
}
