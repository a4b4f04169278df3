package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// stateReadTimeout bounds the read of the state at a scrape.
const stateReadTimeout = 10 * time.Second

var (
	buildsDesc = prometheus.NewDesc("nodepool_builder_builds",
		"Builds in the state, by image, source (dib, zuul) and state.", []string{"image", "source", "state"}, nil)
	uploadsDesc = prometheus.NewDesc("nodepool_builder_uploads",
		"Uploads in the state, by image, provider and state.", []string{"image", "provider", "state"}, nil)
	uploadAgeDesc = prometheus.NewDesc("nodepool_builder_upload_age_seconds",
		"Age of the newest ready upload of an image in a provider.", []string{"image", "provider"}, nil)
	stateUpDesc = prometheus.NewDesc("nodepool_builder_state_up",
		"1 when the state could be read at this scrape, 0 when not (the counts are then missing).", nil, nil)
	gearmanDesc = prometheus.NewDesc("nodepool_builder_gearman_connected",
		"1 while connected to the gearman server, 0 when not.", []string{"server"}, nil)
	zookeeperDesc = prometheus.NewDesc("nodepool_builder_zookeeper_connected",
		"1 while the ZooKeeper session is up, 0 when not.", nil, nil)
	mqttConnectedDesc = prometheus.NewDesc("nodepool_builder_zuul_mqtt_connected",
		"1 while connected and subscribed to Zuul's MQTT broker, 0 when not.", nil, nil)
	mqttLastMessageDesc = prometheus.NewDesc("nodepool_builder_zuul_mqtt_last_message_timestamp_seconds",
		"Unix time the last message from Zuul's MQTT broker arrived, used or not.", nil, nil)
	mqttMessagesDesc = prometheus.NewDesc("nodepool_builder_zuul_mqtt_messages_total",
		"Messages from Zuul's MQTT broker, by outcome: used (a zuul-image was polled for it), or why it was ignored.",
		[]string{"outcome"}, nil)
	mqttPollsDesc = prometheus.NewDesc("nodepool_builder_zuul_mqtt_polls_total",
		"Polls of zuul-images that Zuul's MQTT reports asked for.", nil, nil)
)

var (
	buildStates  = []store.State{store.Building, store.Ready, store.Deleting, store.Failed}
	uploadStates = []store.State{store.Uploading, store.Ready, store.Deleting, store.Failed}
)

// describe is a collector's Describe: it sends the descriptions of every
// metric the collector may send.
func describe(ch chan<- *prometheus.Desc, descs ...*prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// stateCollector reads the builds and uploads at every scrape: the gauges are
// those of the state now, whoever changed it.
type stateCollector struct{ m *Metrics }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, buildsDesc, uploadsDesc, uploadAgeDesc, stateUpDesc)
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	read := c.m.state
	c.m.mu.Unlock()
	if read == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateReadTimeout)
	defer cancel()
	builds, uploads, err := read(ctx)
	if err != nil {
		c.m.log.Warn("metrics: cannot read the state", "error", err)
		ch <- prometheus.MustNewConstMetric(stateUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(stateUpDesc, prometheus.GaugeValue, 1)

	type buildKey struct {
		image  string
		source store.SourceName
	}
	nb := map[buildKey]map[store.State]int{}
	for _, b := range builds {
		k := buildKey{b.Image, b.Source}
		if nb[k] == nil {
			nb[k] = map[store.State]int{}
		}
		nb[k][b.State]++
	}
	for k, byState := range nb {
		// Every state of a known image, zeros included, so that an alert on
		// "failed > 0" sees the series go back to 0.
		for _, s := range buildStates {
			ch <- prometheus.MustNewConstMetric(buildsDesc, prometheus.GaugeValue, float64(byState[s]), k.image, string(k.source), string(s))
		}
	}

	type uploadKey struct{ image, provider string }
	nu := map[uploadKey]map[store.State]int{}
	newest := map[uploadKey]time.Time{}
	for _, u := range uploads {
		k := uploadKey{u.Image, u.Provider}
		if nu[k] == nil {
			nu[k] = map[store.State]int{}
		}
		nu[k][u.State]++
		if u.State == store.Ready && u.StateTime.After(newest[k]) {
			newest[k] = u.StateTime
		}
	}
	for k, byState := range nu {
		for _, s := range uploadStates {
			ch <- prometheus.MustNewConstMetric(uploadsDesc, prometheus.GaugeValue, float64(byState[s]), k.image, k.provider, string(s))
		}
	}
	now := time.Now()
	for k, t := range newest {
		ch <- prometheus.MustNewConstMetric(uploadAgeDesc, prometheus.GaugeValue, now.Sub(t).Seconds(), k.image, k.provider)
	}
}

// linkCollector reads the connections to gearman, ZooKeeper and Zuul's MQTT
// broker at every scrape.
type linkCollector struct{ m *Metrics }

func (c linkCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, gearmanDesc, zookeeperDesc, mqttConnectedDesc, mqttLastMessageDesc, mqttMessagesDesc, mqttPollsDesc)
}

func (c linkCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	gearman, zk, mqtt := c.m.gearman, c.m.zookeeper, c.m.zuulMQTT
	c.m.mu.Unlock()
	if mqtt != nil {
		if s, ok := mqtt(); ok {
			ch <- prometheus.MustNewConstMetric(mqttConnectedDesc, prometheus.GaugeValue, b2f(s.Connected))
			if !s.LastMessage.IsZero() {
				ch <- prometheus.MustNewConstMetric(mqttLastMessageDesc, prometheus.GaugeValue, float64(s.LastMessage.UnixNano())/1e9)
			}
			ch <- prometheus.MustNewConstMetric(mqttMessagesDesc, prometheus.CounterValue, float64(s.Used), "used")
			for reason, n := range s.Ignored {
				ch <- prometheus.MustNewConstMetric(mqttMessagesDesc, prometheus.CounterValue, float64(n), reason)
			}
			ch <- prometheus.MustNewConstMetric(mqttPollsDesc, prometheus.CounterValue, float64(s.Polls))
		}
	}
	if gearman != nil {
		for _, l := range gearman() {
			ch <- prometheus.MustNewConstMetric(gearmanDesc, prometheus.GaugeValue, b2f(l.Connected), l.Server)
		}
	}
	if zk != nil {
		ch <- prometheus.MustNewConstMetric(zookeeperDesc, prometheus.GaugeValue, b2f(zk()))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
