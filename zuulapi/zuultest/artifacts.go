package zuultest

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// ArtifactSpec describes a file a build publishes. A build's artifacts are
// listed in the order of its BuildSpec.Artifacts, after the Zuul manifest.
// That is Zuul's order when the job returned them that way round:
// zuul_return puts the artifacts of each return before those returned
// earlier (merge_zuul_list in zuul/ansible/base/action/zuul_return.py), so
// that a job that uploads qcow2, then raw, with upload-image-swift lists raw
// first, and the manifest, returned last by the base job's post-run, before
// both.
type ArtifactSpec struct {
	// Name is the artifact's name in the API; the upload-image-swift and
	// upload-image-s3 roles of zuul-jobs name theirs "<format> image".
	Name string
	// File is the file name under the build's log URL; Name plus the
	// compression suffix when empty.
	File string
	// Metadata is published as is, except that sha256 and md5sum of the
	// uncompressed content are added when absent (set them to publish
	// wrong checksums), unless MetadataAsIs.
	Metadata map[string]any
	// MetadataAsIs publishes Metadata exactly: nil as no metadata at all (a
	// job that returned none), empty as {} (one that returned it empty);
	// Zuul keeps the two apart (see artifactsJSON).
	MetadataAsIs bool
	// Data is the content; or Path names a file served from disk, which
	// must stay in place until the Server is closed. Path-backed content
	// is streamed, never held in memory.
	Data []byte
	Path string
	// Compress is "" (none), "zst" or "gz".
	Compress string
	// Relative has the job return the URL relative to its log URL, as
	// generate-zuul-manifest does. Zuul joins it onto the log URL before it
	// stores it (get_artifacts_from_result_data in zuul/lib/result_data.py),
	// so that the API and the MQTT reports show it absolute all the same.
	Relative bool
	// OnObjectStore publishes the file on the server's object store, a
	// second host, at <ObjectStoreURL>/<container>/<build uuid>-<File>, as
	// upload-image-swift and upload-image-s3 do (os.path.join(endpoint,
	// container, name), with name "{{ zuul.build }}-<image>.<ext>"), rather
	// than under the log URL. ServerOptions.ObjectStore does it for all.
	OnObjectStore bool
	// Publish, when set, rewrites the absolute URL the API publishes: to add
	// a signed link's query (which the server ignores), or to point at a
	// redirector in front of the server. The file is still served at Path.
	Publish func(url string) string
}

// Artifact is an artifact as the Server publishes it.
type Artifact struct {
	Name string
	// URL is the absolute URL of the file; Path is its path on the server
	// (or on its object store), which the BytesServed, ArtifactRequests and
	// DropAfter hooks take.
	URL  string
	Path string
	// Metadata is what the API reports; nil when it reports none.
	Metadata map[string]any
	// SHA256, MD5 and Size describe the uncompressed content; ServedSize
	// is the size of the file as served.
	SHA256     string
	MD5        string
	Size       int64
	ServedSize int64

	published string // the url field in the API
}

type file struct {
	name    string
	data    []byte // served from memory, or
	disk    string // from this file
	modTime time.Time
	onStore bool   // served by the object store, not under /logs/
	ctype   string // the Content-Type; application/octet-stream when empty
}

func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

func compressor(kind string, w io.Writer) (io.WriteCloser, error) {
	switch kind {
	case "zst":
		return zstd.NewWriter(w, zstd.WithEncoderConcurrency(1))
	case "gz":
		return gzip.NewWriter(w), nil
	}
	return nil, fmt.Errorf("unknown compression %q (want \"\", \"zst\" or \"gz\")", kind)
}

// objectContainer is the container (or bucket) of the object store.
const objectContainer = "images"

// prepareArtifact checksums the content, compresses it when asked and
// returns the file to serve, under the log URL of build uuid or on the object
// store, with the artifact as published.
func (s *Server) prepareArtifact(logURL, uuid string, as ArtifactSpec, onStore bool, modTime time.Time) (*file, Artifact, error) {
	if as.Name == "" {
		return nil, Artifact{}, errors.New("artifact has no name")
	}
	if as.Data != nil && as.Path != "" {
		return nil, Artifact{}, errors.New("artifact has both Data and Path")
	}
	if onStore && as.Relative {
		return nil, Artifact{}, errors.New("artifact is on the object store, which a URL relative to the log URL cannot name")
	}
	name := as.File
	if name == "" {
		name = as.Name
		if as.Compress != "" && !strings.HasSuffix(name, "."+as.Compress) {
			name += "." + as.Compress
		}
	}
	if modTime.IsZero() {
		modTime = time.Now()
	}
	f := &file{name: name, modTime: modTime, onStore: onStore}
	art := Artifact{Name: as.Name, Path: "/logs/" + uuid + "/" + name, URL: logURL + escapePath(name)}
	if onStore {
		art.Path = "/" + objectContainer + "/" + uuid + "-" + name
		art.URL = s.ObjectStoreURL() + escapePath(art.Path)
	}
	if as.Publish != nil {
		art.URL = as.Publish(art.URL)
	}
	// What the job returned, relative or not, is stored joined onto its log
	// URL (zuul/lib/result_data.py).
	art.published = art.URL

	sha, md := sha256.New(), md5.New()
	sums := io.MultiWriter(sha, md)
	switch {
	case as.Path != "":
		size, served, disk, err := s.prepareFromDisk(as, sums)
		if err != nil {
			return nil, Artifact{}, err
		}
		art.Size, art.ServedSize, f.disk = size, served, disk
	default:
		sums.Write(as.Data)
		art.Size = int64(len(as.Data))
		f.data = bytes.Clone(as.Data)
		if f.data == nil {
			f.data = []byte{}
		}
		if as.Compress != "" {
			var buf bytes.Buffer
			zw, err := compressor(as.Compress, &buf)
			if err != nil {
				return nil, Artifact{}, err
			}
			if _, err := zw.Write(as.Data); err != nil {
				return nil, Artifact{}, fmt.Errorf("compress: %w", err)
			}
			if err := zw.Close(); err != nil {
				return nil, Artifact{}, fmt.Errorf("compress: %w", err)
			}
			f.data = buf.Bytes()
		}
		art.ServedSize = int64(len(f.data))
	}
	art.SHA256 = hex.EncodeToString(sha.Sum(nil))
	art.MD5 = hex.EncodeToString(md.Sum(nil))

	art.Metadata = maps.Clone(as.Metadata)
	if as.MetadataAsIs {
		return f, art, nil
	}
	if art.Metadata == nil {
		art.Metadata = map[string]any{}
	}
	if _, ok := art.Metadata["sha256"]; !ok {
		art.Metadata["sha256"] = art.SHA256
	}
	if _, ok := art.Metadata["md5sum"]; !ok {
		art.Metadata["md5sum"] = art.MD5
	}
	return f, art, nil
}

// prepareFromDisk streams the file at as.Path through sums and, when
// compression is asked for, into a compressed copy in the server's
// scratch directory. It returns the sizes and the file to serve.
func (s *Server) prepareFromDisk(as ArtifactSpec, sums io.Writer) (size, served int64, disk string, err error) {
	src, err := os.Open(as.Path)
	if err != nil {
		return 0, 0, "", err
	}
	defer src.Close()
	if as.Compress == "" {
		n, err := io.Copy(sums, src)
		if err != nil {
			return 0, 0, "", fmt.Errorf("read %s: %w", as.Path, err)
		}
		return n, n, as.Path, nil
	}
	dir, err := s.scratchDir()
	if err != nil {
		return 0, 0, "", err
	}
	dst, err := os.CreateTemp(dir, "artifact-*."+as.Compress)
	if err != nil {
		return 0, 0, "", fmt.Errorf("create compressed copy of %s: %w", as.Path, err)
	}
	defer dst.Close()
	zw, err := compressor(as.Compress, dst)
	if err != nil {
		return 0, 0, "", err
	}
	n, err := io.Copy(io.MultiWriter(sums, zw), src)
	if err != nil {
		return 0, 0, "", fmt.Errorf("compress %s: %w", as.Path, err)
	}
	if err := zw.Close(); err != nil {
		return 0, 0, "", fmt.Errorf("compress %s: %w", as.Path, err)
	}
	st, err := dst.Stat()
	if err != nil {
		return 0, 0, "", fmt.Errorf("stat compressed copy of %s: %w", as.Path, err)
	}
	if err := dst.Close(); err != nil {
		return 0, 0, "", fmt.Errorf("write compressed copy of %s: %w", as.Path, err)
	}
	return n, st.Size(), dst.Name(), nil
}

func (s *Server) scratchDir() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tmpDir == "" {
		dir, err := os.MkdirTemp("", "zuultest-")
		if err != nil {
			return "", fmt.Errorf("create scratch directory: %w", err)
		}
		s.tmpDir = dir
	}
	return s.tmpDir, nil
}

// handleFile serves the files under the log URLs.
func (s *Server) handleFile(w http.ResponseWriter, r *http.Request) {
	s.serveFile(w, r, false)
}

// serveFile serves artifact files with http.ServeContent, so Range, HEAD and
// Content-Length behave like a real log server or object store. onStore tells
// which host asks: each serves its own files only.
func (s *Server) serveFile(w http.ResponseWriter, r *http.Request, onStore bool) {
	p := r.URL.Path
	s.mu.Lock()
	f := s.files[p]
	if f == nil || f.onStore != onStore {
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	rng := r.Header.Get("Range")
	s.requests[p] = append(s.requests[p], RequestInfo{Method: r.Method, Range: rng, UserAgent: r.UserAgent()})
	limit := int64(-1)
	if r.Method == http.MethodGet && rng == "" {
		if n, ok := s.drops[p]; ok {
			limit = n
			delete(s.drops, p)
		}
	}
	s.mu.Unlock()

	var content io.ReadSeeker
	if f.disk != "" {
		fh, err := os.Open(f.disk)
		if err != nil {
			http.Error(w, "artifact file is gone", http.StatusInternalServerError)
			return
		}
		defer fh.Close()
		content = fh
	} else {
		content = bytes.NewReader(f.data)
	}
	ctype := f.ctype
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	http.ServeContent(&countingWriter{ResponseWriter: w, s: s, path: p, limit: limit}, r, f.name, f.modTime, content)
}

// countingWriter counts the body bytes sent for an artifact and, when
// limit >= 0, breaks the connection once limit bytes are out.
type countingWriter struct {
	http.ResponseWriter
	s       *Server
	path    string
	limit   int64
	written int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	drop := false
	if c.limit >= 0 && c.written+int64(len(p)) > c.limit {
		p = p[:c.limit-c.written]
		drop = true
	}
	n, err := c.ResponseWriter.Write(p)
	c.written += int64(n)
	c.s.mu.Lock()
	c.s.served[c.path] += int64(n)
	c.s.mu.Unlock()
	if drop {
		// Get the bytes so far onto the wire, then let net/http close the
		// connection without a complete body, as a dropped link would.
		_ = http.NewResponseController(c.ResponseWriter).Flush()
		panic(http.ErrAbortHandler)
	}
	return n, err
}
