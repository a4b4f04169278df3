package uploader

import (
	"context"
	"fmt"
	"slices"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Artifact is a format of a Zuul build being fetched, as its artifact
// publishes it.
type Artifact struct {
	// Declared is the file as the artifact declares it: its format,
	// checksums and size.
	Declared store.File
	// URL is where a cloud may fetch the image itself (web-download); ""
	// when none may, and NotWeb says why.
	URL, NotWeb string
}

// sending is how an attempt gets the image to the cloud.
type sending struct {
	// method is the upload-method used: the provider's, or the one its
	// web-download falls back to.
	method string
	imp    Importer // nil for a plain PUT
	// uri is, for web-download, the address the cloud fetches the image at;
	// the attempt then reads no file.
	uri string
}

// how decides how the attempt sends the image, before anything is made in
// the cloud. A provider whose upload-method is web-download has the cloud
// fetch the artifact when the attempt was given its address (an upload
// started as the Zuul build is fetched), or when the build's file of the
// format was never downloaded (its URL is recorded for the clouds to fetch).
// Otherwise the file is sent, staged for glance-direct when the cloud offers
// it, else by PUT, and why is said once.
func (a *attempt) how(ctx context.Context) (sending, error) {
	s := sending{method: a.u.opts.Config.Builder.UploadMethod(a.provider.Name)}
	if s.method == config.UploadWebDownload {
		s.uri = a.uri
		if s.uri == "" && a.stream == nil && !a.file.Present && a.file.URL != "" {
			s.uri = a.file.URL
		}
		if s.uri == "" {
			method, err := a.fallback(ctx)
			if err != nil {
				return s, err
			}
			a.u.sayFallback(a.provider.Name, a.notWeb(), method)
			s.method = method
		}
	}
	imp, err := a.importer(ctx, s.method)
	if err != nil {
		if s.uri != "" && !a.file.Present {
			err = fmt.Errorf("%w; the build's %s file was not downloaded, since only clouds that fetch it themselves "+
				"needed it: the next Zuul build is downloaded for this provider if it still cannot", err, a.file.Format)
		}
		return s, err
	}
	s.imp = imp
	return s, nil
}

// notWeb says why an attempt of a web-download provider sends the file.
func (a *attempt) notWeb() string {
	switch {
	case a.webWhy != "":
		return a.webWhy
	case a.build.Source != store.SourceZuul:
		return "the image was built here, not by Zuul: there is no artifact for the cloud to fetch"
	}
	return "the build's file was downloaded: an upload made once the Zuul build is fetched sends it"
}

// fallback is the method a web-download provider's attempt sends the file
// by: glance-direct where the cloud offers it, else put.
func (a *attempt) fallback(ctx context.Context) (string, error) {
	imp, ok := a.cloud.(Importer)
	if !ok {
		return config.UploadPut, nil
	}
	cctx, cancel := a.u.cloudCtx(ctx)
	defer cancel()
	methods, err := imp.ImportMethods(cctx)
	if err != nil {
		return "", fmt.Errorf("ask the cloud which import methods it offers: %w", err)
	}
	if slices.Contains(methods, config.UploadGlanceDirect) {
		return config.UploadGlanceDirect, nil
	}
	return config.UploadPut, nil
}

// sayFallback says, once for each provider, reason and method, that a
// provider whose upload-method is web-download is sent the file instead;
// method is "" when it is chosen as the upload begins.
func (u *Uploader) sayFallback(provider, why, method string) {
	if _, said := u.fellBack.LoadOrStore(provider+"\x00"+why+"\x00"+method, true); said {
		return
	}
	args := []any{"provider", provider, "reason", why}
	if method != "" {
		args = append(args, "method", method)
	}
	u.log.Info("upload-method web-download not used: the image is sent", args...)
}

// webFetches tells whether an upload of file f to provider has the cloud
// fetch the image itself: f was never downloaded, its URL recorded for the
// clouds to fetch, and the provider's upload-method is web-download.
func (u *Uploader) webFetches(provider string, f store.File) bool {
	return !f.Present && f.URL != "" && u.opts.Config.Builder.UploadMethod(provider) == config.UploadWebDownload
}

// Uploadable tells whether a build's file f can be uploaded to provider: it
// is on disk, or the provider's cloud fetches it itself.
func (u *Uploader) Uploadable(provider string, f store.File) bool {
	return f.Present || u.webFetches(provider, f)
}

// checkFetched compares what the cloud stored from a web-download with what
// the artifact declares: its md5 and its size. Glance's other digest
// (os_hash_value) is of its own algorithm, sha512 by default.
func checkFetched(img CloudImage, f store.File) error {
	if err := checkStored(img, f); err != nil {
		return fmt.Errorf("the artifact the cloud fetched is not the one declared: %w", err)
	}
	if f.Size > 0 && img.Size > 0 && img.Size != f.Size {
		return fmt.Errorf("the artifact the cloud fetched is not the one declared: the cloud stored %d bytes but the "+
			"artifact declares %d", img.Size, f.Size)
	}
	return nil
}
