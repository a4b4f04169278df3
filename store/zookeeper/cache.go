package zookeeper

import (
	"bytes"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// cache mirrors the image records under /nodepool/images: builds, uploads, our
// extra nodes, pause flags and build requests. One-shot watches, set again on
// every read, keep it fresh, so a pass over every image reads no znode; writes
// of this process go into it as they succeed, so a step sees its own changes at
// once. A node is read again whenever ZooKeeper reports a change of it.
//
// A write checks the version of a record's node only; its extra node is
// written along without a check. So a cached record's extra node is never
// older than its node: the two go in together, the extra node read after the
// node, and a node is never replaced by an older state of it. A record read
// with a version newer than its extra node would pass the check with fields
// from before the change it raced, and undo them.
//
// A step reads every build and upload, tens of thousands of them in a large
// installation, several times: records are decoded once, when a read first
// needs them after their nodes changed, and kept sorted in a view that the reads
// share until the next change.
type cache struct {
	b *Backend

	mu     sync.RWMutex
	nodes  map[string]*node // by path
	loaded bool
	// gone remembers nodes this process deleted, by path and creation zxid, so
	// that a read made before the delete does not bring them back.
	gone map[string]int64

	// Indexes of nodes, kept by setNode and unsetNode, so that a read looks at
	// no node it does not return. A nil record is not decoded yet.
	builds  map[string]*record[store.Build]             // by build path
	uploads map[string]map[string]*record[store.Upload] // by build path, then upload path
	flagged map[string]bool                             // pause and request-build nodes
	// view is made by the first read after a change of a build or an upload
	// and never changed: a change drops it.
	view *view

	qmu     sync.Mutex
	queue   []string
	queued  map[string]bool
	wake    chan struct{}
	stopped chan struct{}
	reload  bool // a session expired: every watch is gone
	once    sync.Once
}

// node is one cached znode.
type node struct {
	data     []byte
	stat     zk.Stat
	children []string // for nodes whose children are followed
	// watched: a read of this process set watches on the node. A node it
	// wrote has none until it is read, which put queues.
	watched bool
	// unread: this process made the node and has not read it yet. A listing
	// of its parent may be older than it, so only its own read may drop it.
	unread bool
}

// record is a build or an upload decoded from its node and its extra node.
type record[T any] struct {
	rec T
	ok  bool // false: the node does not parse, or holds no data yet
}

// view is every cached build, newest first, and every upload of them, by
// build in that order, then by provider, newest upload first: the order
// Builds and Uploads return.
type view struct {
	builds  []store.Build
	uploads []store.Upload
	spans   [][2]int // the uploads of builds[i] are uploads[spans[i][0]:spans[i][1]]
}

// kinds of the nodes the cache follows, by their place in the tree.
type kind int

const (
	kindOther       kind = iota
	kindRoot             // /nodepool/images
	kindImage            // .../<image>
	kindFlag             // .../<image>/pause, request-build
	kindBuilds           // .../<image>/builds
	kindBuild            // .../builds/<id>
	kindBuildExtra       // .../builds/<id>/nodepool-builder
	kindProviders        // .../builds/<id>/providers
	kindProvider         // .../providers/<provider>
	kindUploads          // .../providers/<provider>/images
	kindUpload           // .../images/<upload id>
	kindUploadExtra      // .../images/<upload id>/nodepool-builder
)

// classify tells what a path under /nodepool/images is.
func classify(p string) kind {
	if p == imageRoot {
		return kindRoot
	}
	rest, ok := strings.CutPrefix(p, imageRoot+"/")
	if !ok {
		return kindOther
	}
	// Split without allocating: classify runs several times for each node read.
	var segs [8]string
	n := 0
	for {
		if n == len(segs) {
			return kindOther
		}
		var more bool
		segs[n], rest, more = strings.Cut(rest, "/")
		n++
		if !more {
			break
		}
	}
	parts := segs[:n]
	last := parts[len(parts)-1]
	if last == lockNode || strings.Contains(last, "__lock__") {
		return kindOther
	}
	switch len(parts) {
	case 1:
		return kindImage
	case 2:
		switch parts[1] {
		case "builds":
			return kindBuilds
		case "pause", "request-build":
			return kindFlag
		}
	case 3:
		if parts[1] == "builds" {
			return kindBuild
		}
	case 4:
		switch {
		case parts[1] != "builds":
		case parts[3] == extraNode:
			return kindBuildExtra
		case parts[3] == "providers":
			return kindProviders
		}
	case 5:
		if parts[1] == "builds" && parts[3] == "providers" {
			return kindProvider
		}
	case 6:
		if parts[1] == "builds" && parts[3] == "providers" && parts[5] == "images" {
			return kindUploads
		}
	case 7:
		if parts[1] == "builds" && parts[3] == "providers" && parts[5] == "images" {
			return kindUpload
		}
	case 8:
		if parts[1] == "builds" && parts[3] == "providers" && parts[5] == "images" && parts[7] == extraNode {
			return kindUploadExtra
		}
	}
	return kindOther
}

// followed tells whether the cache keeps a child of a node of kind k.
func followed(k kind, child string) bool {
	switch k {
	case kindRoot:
		return true
	case kindImage:
		return child == "builds" || child == "pause" || child == "request-build"
	case kindBuilds, kindProviders, kindUploads:
		return child != lockNode
	case kindBuild:
		return child == "providers" || child == extraNode
	case kindProvider:
		return child == "images"
	case kindUpload:
		return child == extraNode
	}
	return false
}

func newCache(b *Backend) *cache {
	c := &cache{b: b, gone: map[string]int64{}, queued: map[string]bool{},
		wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	c.reset()
	return c
}

// reset empties the cache; the caller holds mu or is the only user.
func (c *cache) reset() {
	c.nodes = map[string]*node{}
	c.builds = map[string]*record[store.Build]{}
	c.uploads = map[string]map[string]*record[store.Upload]{}
	c.flagged = map[string]bool{}
	c.view = nil
}

// setNode caches a node, keeping the indexes. A record whose node or extra
// node changed is decoded again by the next read.
func (c *cache) setNode(p string, n *node) {
	old := c.nodes[p]
	c.nodes[p] = n
	changed := old == nil || (old.data == nil) != (n.data == nil) || !bytes.Equal(old.data, n.data) ||
		old.stat.Version != n.stat.Version || old.stat.Ctime != n.stat.Ctime
	switch classify(p) {
	case kindBuild:
		if _, ok := c.builds[p]; !ok || changed {
			c.builds[p] = nil
			c.view = nil
		}
	case kindUpload:
		ups := c.uploads[buildOf(p)]
		if ups == nil {
			ups = map[string]*record[store.Upload]{}
			c.uploads[buildOf(p)] = ups
		}
		if _, ok := ups[p]; !ok || changed {
			ups[p] = nil
			c.view = nil
		}
	case kindBuildExtra, kindUploadExtra:
		if changed {
			c.stale(p[:strings.LastIndex(p, "/")])
		}
	case kindFlag:
		c.flagged[p] = true
	}
}

// unsetNode drops a cached node, keeping the indexes.
func (c *cache) unsetNode(p string) {
	if _, ok := c.nodes[p]; !ok {
		return
	}
	delete(c.nodes, p)
	switch classify(p) {
	case kindBuild:
		delete(c.builds, p)
		c.view = nil
	case kindUpload:
		bp := buildOf(p)
		delete(c.uploads[bp], p)
		if len(c.uploads[bp]) == 0 {
			delete(c.uploads, bp)
		}
		c.view = nil
	case kindBuildExtra, kindUploadExtra:
		c.stale(p[:strings.LastIndex(p, "/")])
	case kindFlag:
		delete(c.flagged, p)
	}
}

// stale drops the decoded record of a build or upload whose extra node changed.
func (c *cache) stale(p string) {
	if _, ok := c.builds[p]; ok {
		c.builds[p] = nil
		c.view = nil
	} else if ups := c.uploads[buildOf(p)]; ups != nil {
		if _, ok := ups[p]; ok {
			ups[p] = nil
			c.view = nil
		}
	}
}

// buildOf is the path of the build an upload path (or a path below a build)
// lies under.
func buildOf(p string) string {
	image, rest, _ := strings.Cut(strings.TrimPrefix(p, imageRoot+"/"), "/builds/")
	id, _, _ := strings.Cut(rest, "/")
	return buildPath(image, id)
}

// load reads the whole tree with watches, in parallel, then starts following
// changes.
func (c *cache) load() error {
	c.mu.Lock()
	if c.loaded {
		// Again, after a session expired and its watches with it: the records
		// stay readable while every node is read again (a reload takes long at
		// scale, and an empty cache would show builds without their uploads).
		for _, n := range c.nodes {
			n.watched = false
		}
	} else {
		c.reset()
	}
	c.mu.Unlock()
	c.qmu.Lock()
	c.reload = false
	c.qmu.Unlock()

	if err := c.walk(imageRoot); err != nil {
		return err
	}
	c.mu.Lock()
	c.loaded = true
	c.mu.Unlock()
	c.once.Do(func() { go c.run() })
	return nil
}

// loadWorkers is how many reads a load has in flight.
const loadWorkers = 64

// walk refreshes root and every followed node below it, loadWorkers at a
// time, and returns the first error. Each worker takes the next path from a
// queue that the children found join: a goroutine for each of tens of
// thousands of nodes would cost more than reading them (each grows its stack
// afresh).
func (c *cache) walk(root string) error {
	var (
		mu      sync.Mutex
		more    = sync.NewCond(&mu)
		queue   = []string{root}
		pending = 1 // paths queued or being read
		first   error
		wg      sync.WaitGroup
	)
	for range loadWorkers {
		wg.Go(func() {
			mu.Lock()
			defer mu.Unlock()
			for {
				for len(queue) == 0 && pending > 0 {
					more.Wait()
				}
				if pending == 0 {
					return
				}
				// Depth first: the queue stays short.
				p := queue[len(queue)-1]
				queue = queue[:len(queue)-1]
				mu.Unlock()
				kids, err := c.refresh(p)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				queue = append(queue, kids...)
				pending += len(kids) - 1
				if len(kids) > 0 || pending == 0 {
					more.Broadcast()
				}
			}
		})
	}
	wg.Wait()
	return first
}

func (c *cache) stop() {
	select {
	case <-c.stopped:
	default:
		close(c.stopped)
	}
}

// needsReload tells, after a new session, whether the watches went with the
// old one.
func (c *cache) needsReload() bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.reload
}

// changed queues a path ZooKeeper reported a change of; for a session lost,
// the cache must be loaded again.
func (c *cache) changed(p string, t zk.EventType) {
	if t == zk.EventNotWatching {
		c.watchesLost()
		return
	}
	c.enqueue(p)
}

// watchesLost records that the watches went with a session: the next one
// must read everything again.
func (c *cache) watchesLost() {
	c.qmu.Lock()
	c.reload = true
	c.qmu.Unlock()
}

func (c *cache) enqueue(p string) {
	c.qmu.Lock()
	if !c.queued[p] {
		c.queued[p] = true
		c.queue = append(c.queue, p)
	}
	c.qmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run reads again what changed, one path at a time.
func (c *cache) run() {
	for {
		c.qmu.Lock()
		var p string
		if len(c.queue) > 0 {
			p = c.queue[0]
			c.queue = c.queue[1:]
			delete(c.queued, p)
		}
		c.qmu.Unlock()
		if p == "" {
			select {
			case <-c.stopped:
				return
			case <-c.wake:
			}
			continue
		}
		kids, err := c.refresh(p)
		if err != nil {
			// The connection is lost, most likely: the node is read again
			// once it may be back. Only stop ends this loop; were it to end
			// here, the cache would follow nothing from then on.
			c.b.log.Debug("cache: read again later", "path", p, "error", err)
			c.enqueue(p)
			select {
			case <-c.stopped:
				return
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		for _, k := range kids {
			c.enqueue(k)
		}
	}
}

// refresh reads a node, and its children when it has followed ones, setting
// watches on both, and returns the followed children the cache has not seen.
//
// It reads no more than it needs to follow the node, since a builder opening
// reads every node of a large tree: a node whose data holds nothing the cache
// keeps (an image, and the nodes that only hold others) is listed only, whose
// watch also tells of its deletion; an upload, whose only followed child is
// its extra node, is not listed: the extra node is read at once, and only
// when it is missing are the upload's children watched, to tell when it comes.
func (c *cache) refresh(p string) ([]string, error) {
	k := classify(p)
	switch k {
	case kindOther:
		return nil, nil
	case kindProvider:
		return c.refreshProvider(p)
	}
	data, stat, kids, err := c.readNode(p, k)
	var x extra
	if err == nil {
		x, kids, err = c.readExtra(p, k, kids)
	}
	if errors.Is(err, zk.ErrNoNode) {
		return nil, c.dropVanished(p, k)
	}
	if err != nil {
		return nil, err
	}
	return c.keepRead(p, k, data, stat, kids, x), nil
}

// nodeReads says what refresh reads of a node of kind k: its data (get), and
// its children (list). A node whose data holds nothing the cache keeps is
// listed only; one with no followed children (an upload's is its extra node,
// which readExtra reads) is not listed.
func nodeReads(k kind) (get, list bool) {
	switch k {
	case kindBuild, kindBuildExtra, kindUpload, kindUploadExtra, kindFlag:
		get = true
	}
	switch k {
	case kindBuildExtra, kindUploadExtra, kindFlag, kindUpload:
	default:
		list = true
	}
	return get, list
}

// readNode reads a node as nodeReads says, with watches, and returns its
// followed children, sorted. The stat is the data's, or else the listing's.
func (c *cache) readNode(p string, k kind) (data []byte, stat *zk.Stat, kids []string, err error) {
	get, list := nodeReads(k)
	if get {
		if data, stat, err = c.b.getW(p); err != nil {
			return nil, nil, nil, err
		}
	}
	if !list {
		return data, stat, nil, nil
	}
	all, lstat, err := c.b.childrenW(p)
	if err != nil {
		return nil, nil, nil, err
	}
	if stat == nil {
		stat = lstat
	}
	for _, ch := range all {
		if followed(k, ch) {
			kids = append(kids, ch)
		}
	}
	sort.Strings(kids)
	return data, stat, kids, nil
}

// extra is a record's extra node as read; a zero extra when it has none.
type extra struct {
	data []byte
	stat *zk.Stat
}

// readExtra reads a record's extra node after the record, so that it is no
// older, to be cached with it: another builder's write of both must not show
// as the node's new version with the extra node's old fields. It returns the
// node's followed children: an upload's is its extra node, when it has one.
// zk.ErrNoNode means the upload went between the two reads.
func (c *cache) readExtra(p string, k kind, kids []string) (extra, []string, error) {
	switch {
	case k == kindBuild && slices.Contains(kids, extraNode):
		data, stat, err := c.b.getW(p + "/" + extraNode)
		if errors.Is(err, zk.ErrNoNode) {
			return extra{}, kids, nil // its own event drops it
		}
		return extra{data, stat}, kids, err
	case k == kindUpload:
		data, stat, err := c.b.getW(p + "/" + extraNode)
		if err == nil {
			if stat != nil {
				kids = []string{extraNode}
			}
			return extra{data, stat}, kids, nil
		}
		if errors.Is(err, zk.ErrNoNode) {
			// A read of a missing node sets no watch: the upload's children
			// are watched instead, which tells when it is made (a watch of
			// its existence would outlive an upload deleted without it).
			// Made meanwhile, it is read as any other change.
			var all []string
			all, _, err = c.b.childrenW(p)
			if err == nil && slices.Contains(all, extraNode) {
				c.enqueue(p + "/" + extraNode)
			}
		}
		return extra{}, kids, err
	}
	return extra{}, kids, nil
}

// dropVanished drops a node that was deleted between its listing and its
// reading, which is no error. The root is watched for it to come again.
func (c *cache) dropVanished(p string, k kind) error {
	c.remove(p)
	if k == kindRoot {
		_, _, err := c.b.existsW(p)
		return err
	}
	return nil
}

// keepRead caches what refresh read and returns the followed children the
// cache has not seen. The record is decoded here, by its reader and outside
// the lock: opening reads tens of thousands of them, and each one decoded
// while others are on the wire is one the first step need not decode on its
// own.
func (c *cache) keepRead(p string, k kind, data []byte, stat *zk.Stat, kids []string, x extra) []string {
	var build *record[store.Build]
	var upload *record[store.Upload]
	switch k {
	case kindBuild:
		image, id := buildKey(p)
		if b, err := decodeBuild(image, id, data, stat, x.data); err == nil {
			build = &record[store.Build]{rec: b, ok: true}
		}
	case kindUpload:
		image, bid, provider, id := uploadKey(p)
		if u, err := decodeUpload(image, bid, provider, id, data, stat, x.data); err == nil {
			upload = &record[store.Upload]{rec: u, ok: true}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	fresh := c.keep(p, data, stat, kids, x.data, x.stat)
	if build != nil || upload != nil {
		c.decoded(p, stat, x.stat, build, upload)
	}
	return fresh
}

// decoded keeps a record that refresh decoded, when the cache still holds the
// states of its node and extra node it was decoded from (a write of this
// process may have been later); else the next read decodes what the cache
// holds. A record that does not parse is left to that read too, which says
// so. The caller holds mu.
func (c *cache) decoded(p string, stat, xstat *zk.Stat, build *record[store.Build], upload *record[store.Upload]) {
	n := c.nodes[p]
	if n == nil || !sameState(n.stat, *stat) {
		return
	}
	x := c.nodes[p+"/"+extraNode]
	if (x == nil) != (xstat == nil) || x != nil && !sameState(x.stat, *xstat) {
		return
	}
	if build != nil {
		if _, ok := c.builds[p]; ok {
			c.builds[p] = build
		}
	}
	if upload != nil {
		if ups := c.uploads[buildOf(p)]; ups != nil {
			if _, ok := ups[p]; ok {
				ups[p] = upload
			}
		}
	}
}

// sameState tells whether two stats are of one state of one node.
func sameState(a, b zk.Stat) bool {
	return a.Czxid == b.Czxid && a.Mzxid == b.Mzxid && a.Version == b.Version
}

// refreshProvider follows a provider node of a build, whose only followed
// child is the node that holds its uploads: that one is listed at once, with
// a watch, and the provider node itself is not read (its parent's watch tells
// when it goes). When the uploads node is missing, the provider's children
// are watched until it comes.
func (c *cache) refreshProvider(p string) ([]string, error) {
	up := p + "/images"
	all, stat, err := c.b.childrenW(up)
	if errors.Is(err, zk.ErrNoNode) {
		// The provider's children are watched instead, which tells when it
		// comes, or that the provider went.
		kids, _, err := c.b.childrenW(p)
		if errors.Is(err, zk.ErrNoNode) {
			c.remove(p)
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if slices.Contains(kids, "images") {
			c.enqueue(up) // made meanwhile
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.keep(p, nil, c.statOf(p), nil, nil, nil)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var kids []string
	for _, ch := range all {
		if followed(kindUploads, ch) {
			kids = append(kids, ch)
		}
	}
	sort.Strings(kids)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keep(p, nil, c.statOf(p), []string{"images"}, nil, nil)
	return c.keep(up, nil, stat, kids, nil, nil), nil
}

// statOf is the stat of a node the cache does not read, as the cache has
// it: from a write of this process, or none; the caller holds mu.
func (c *cache) statOf(p string) *zk.Stat {
	if n := c.nodes[p]; n != nil {
		st := n.stat
		return &st
	}
	return &zk.Stat{}
}

// keep caches a node as a refresh read it, with its followed children kids,
// sorted, and its extra node when xstat is not nil, and returns those children
// the cache has not seen; the caller holds mu.
func (c *cache) keep(p string, data []byte, stat *zk.Stat, kids []string, xdata []byte, xstat *zk.Stat) []string {
	if czxid, ok := c.gone[p]; ok && czxid == stat.Czxid {
		return nil // a read from before this process deleted it
	}
	old := c.nodes[p]
	if old != nil && later(old.stat, *stat) {
		// A write of this process is newer than this read; the watch that
		// this read set reports what comes after.
		data, stat = old.data, &old.stat
	}
	n := &node{data: data, stat: *stat, children: kids, watched: true}
	c.setNode(p, n)
	if xstat != nil {
		xp := p + "/" + extraNode
		xn := &node{data: xdata, stat: *xstat, watched: true}
		if xo := c.nodes[xp]; xo != nil && later(xo.stat, *xstat) {
			xn.data, xn.stat = xo.data, xo.stat
		}
		c.setNode(xp, xn)
	}
	var fresh []string
	for _, ch := range kids {
		cp := p + "/" + ch
		if cn, ok := c.nodes[cp]; !ok || !cn.watched {
			fresh = append(fresh, cp)
		}
	}
	if old != nil {
		for _, ch := range old.children {
			if _, found := slices.BinarySearch(kids, ch); found {
				continue
			}
			// A node this process made and has not read yet may be younger
			// than this listing: its own read, queued when it was made, tells
			// whether it is gone.
			if cn := c.nodes[p+"/"+ch]; cn != nil && cn.unread {
				continue
			}
			c.removeLocked(p + "/" + ch)
		}
	}
	return fresh
}

func (c *cache) remove(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(p)
}

// removeLocked drops a node and everything below it.
func (c *cache) removeLocked(p string) {
	for q := range c.nodes {
		if q == p || strings.HasPrefix(q, p+"/") {
			c.unsetNode(q)
		}
	}
}

// later tells whether a is a later state of a node than b: the same node
// (not one made again since), changed after. A stat of a node just created by
// this process has no zxids and is never older.
func later(a, b zk.Stat) bool {
	return b.Mzxid != 0 && a.Czxid == b.Czxid && a.Mzxid > b.Mzxid
}

// written is a node as this process wrote or read it.
type written struct {
	path string
	data []byte
	stat zk.Stat
}

// put records what this process wrote or read, all at once: a record's node
// and its extra node must not show apart. A node the cache has a later state
// of keeps it (a write whose answer came late, a read from before a write). A
// node it had not read yet is queued to be read, which sets the watches that
// tell of others' changes to it.
func (c *cache) put(nodes ...written) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range nodes {
		old := c.nodes[w.path]
		if old != nil && later(old.stat, w.stat) {
			continue
		}
		n := &node{data: w.data, stat: w.stat, unread: true}
		if old != nil {
			n.children, n.watched, n.unread = old.children, old.watched, old.unread
			if w.stat.Czxid == 0 {
				n.stat.Czxid, n.stat.Ctime = old.stat.Czxid, old.stat.Ctime
			}
		}
		c.setNode(w.path, n)
		delete(c.gone, w.path)
		c.addChild(w.path)
		if !n.watched {
			c.enqueue(w.path)
		}
	}
}

// addChild makes sure the parents of a written node list it.
func (c *cache) addChild(p string) {
	parent := p[:strings.LastIndex(p, "/")]
	name := p[len(parent)+1:]
	pn := c.nodes[parent]
	if pn == nil {
		if classify(parent) == kindOther || parent == imageRoot {
			return
		}
		pn = &node{unread: true}
		c.setNode(parent, pn)
		c.addChild(parent)
		c.enqueue(parent)
	}
	for _, ch := range pn.children {
		if ch == name {
			return
		}
	}
	pn.children = append(pn.children, name)
	sort.Strings(pn.children)
}

// drop records a node this process deleted.
func (c *cache) drop(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[p]; n != nil && n.stat.Czxid != 0 {
		c.gone[p] = n.stat.Czxid
	}
	c.removeLocked(p)
	parent := p[:strings.LastIndex(p, "/")]
	if pn := c.nodes[parent]; pn != nil {
		name := p[len(parent)+1:]
		kept := pn.children[:0]
		for _, ch := range pn.children {
			if ch != name {
				kept = append(kept, ch)
			}
		}
		pn.children = kept
	}
}

// get returns a cached node.
func (c *cache) get(p string) (*node, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.nodes[p]
	return n, ok
}

// records returns the view of every build and upload, made afresh after a
// change. The caller must not change what it holds.
func (c *cache) records() *view {
	c.mu.RLock()
	v := c.view
	c.mu.RUnlock()
	if v != nil {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.view == nil {
		c.view = c.makeView()
	}
	return c.view
}

// makeView decodes the records that changed and sorts them all; the caller
// holds mu. An upload whose build is not cached (gone, or not read yet) is
// left out.
func (c *cache) makeView() *view {
	type built struct {
		path string
		rec  store.Build
	}
	var builds []built
	for p, r := range c.builds {
		if r == nil {
			r = c.decodeBuild(p)
			c.builds[p] = r
		}
		if r.ok {
			builds = append(builds, built{p, r.rec})
		}
	}
	sort.Slice(builds, func(i, j int) bool {
		a, b := &builds[i].rec, &builds[j].rec
		if !a.Created.Equal(b.Created) {
			return a.Created.After(b.Created)
		}
		return a.ID > b.ID
	})
	n := 0
	for _, bd := range builds {
		n += len(c.uploads[bd.path])
	}
	v := &view{builds: make([]store.Build, len(builds)), uploads: make([]store.Upload, 0, n),
		spans: make([][2]int, len(builds))}
	for i, bd := range builds {
		v.builds[i] = bd.rec
		lo := len(v.uploads)
		for p, r := range c.uploads[bd.path] {
			if r == nil {
				r = c.decodeUpload(p)
				c.uploads[bd.path][p] = r
			}
			if r.ok {
				v.uploads = append(v.uploads, r.rec)
			}
		}
		ups := v.uploads[lo:]
		sort.Slice(ups, func(i, j int) bool {
			if ups[i].Provider != ups[j].Provider {
				return ups[i].Provider < ups[j].Provider
			}
			return ups[i].ID > ups[j].ID
		})
		v.spans[i] = [2]int{lo, len(v.uploads)}
	}
	return v
}

// decodeBuild decodes a cached build node; the caller holds mu.
func (c *cache) decodeBuild(p string) *record[store.Build] {
	n := c.nodes[p]
	if n == nil || n.data == nil {
		return &record[store.Build]{} // made by a write of this process below it; read soon
	}
	image, id := buildKey(p)
	var extra []byte
	if x := c.nodes[p+"/"+extraNode]; x != nil {
		extra = x.data
	}
	b, err := decodeBuild(image, id, n.data, &n.stat, extra)
	if err != nil {
		c.b.log.Warn("refusing a build record: it is not acted on, and left as it is for whoever wrote it", "path", p, "error", err)
		return &record[store.Build]{}
	}
	return &record[store.Build]{rec: b, ok: true}
}

// decodeUpload decodes a cached upload node; the caller holds mu.
func (c *cache) decodeUpload(p string) *record[store.Upload] {
	n := c.nodes[p]
	if n == nil || n.data == nil {
		return &record[store.Upload]{}
	}
	image, build, provider, id := uploadKey(p)
	var extra []byte
	if x := c.nodes[p+"/"+extraNode]; x != nil {
		extra = x.data
	}
	u, err := decodeUpload(image, build, provider, id, n.data, &n.stat, extra)
	if err != nil {
		c.b.log.Warn("refusing an upload record: it is not acted on, and left as it is for whoever wrote it", "path", p, "error", err)
		return &record[store.Upload]{}
	}
	return &record[store.Upload]{rec: u, ok: true}
}

// flags returns, by image, when a flag node (pause or request-build) was made,
// for every image that has one.
func (c *cache) flags(name string) map[string]time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]time.Time{}
	for p := range c.flagged {
		if !strings.HasSuffix(p, "/"+name) {
			continue
		}
		image := strings.TrimSuffix(strings.TrimPrefix(p, imageRoot+"/"), "/"+name)
		out[image] = flagTime(c.nodes[p].data, c.nodes[p].stat)
	}
	return out
}

// imageNames lists the cached children of /nodepool/images, sorted.
func (c *cache) imageNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if n := c.nodes[imageRoot]; n != nil {
		return slices.Clone(n.children)
	}
	return nil
}

// imageOf finds the image of a cached build.
func (c *cache) imageOf(id string) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for p := range c.builds {
		if strings.HasSuffix(p, "/"+id) {
			image, _ := buildKey(p)
			return image, true
		}
	}
	return "", false
}

// buildKey splits a build path into image and id.
func buildKey(p string) (image, id string) {
	parts := strings.Split(strings.TrimPrefix(p, imageRoot+"/"), "/")
	return parts[0], parts[2]
}

// uploadKey splits an upload path into image, build, provider and id.
func uploadKey(p string) (image, build, provider, id string) {
	parts := strings.Split(strings.TrimPrefix(p, imageRoot+"/"), "/")
	return parts[0], parts[2], parts[4], parts[6]
}
