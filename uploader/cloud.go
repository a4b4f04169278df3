package uploader

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned (wrapped) by a Cloud when an image does not exist.
var ErrNotFound = errors.New("image not found")

// ErrUnavailable is wrapped by a Cloud's error when the cloud could not be
// reached or answered that it cannot serve now (a refused connection, a timeout,
// HTTP 5xx): the request may well succeed later, unchanged.
var ErrUnavailable = errors.New("cloud unavailable")

// CloudImage is a cloud image as the uploader sees it.
type CloudImage struct {
	ID         string
	Name       string
	Status     string // Glance status: queued, saving, active, killed, deleted, ...
	DiskFormat string
	Size       int64
	Checksum   string // Glance's md5 of the stored data, when it reports one
	Created    time.Time
	// Owner is the project the image belongs to, as the cloud says; "" when
	// it says none (a Glance without authentication).
	Owner      string
	Properties map[string]string
}

// ImageSpec describes an image to create.
type ImageSpec struct {
	Name       string
	DiskFormat string            // qcow2, raw, vhd, ...; container format is always bare
	Properties map[string]string // stored as Glance image properties
}

// Cloud is the image service of one provider.
type Cloud interface {
	// Create makes an empty private image and returns its ID.
	Create(ctx context.Context, spec ImageSpec) (string, error)
	// Upload streams size bytes of data into the image created by Create.
	Upload(ctx context.Context, id string, data io.Reader, size int64) error
	// Get returns one image; ErrNotFound when it does not exist.
	Get(ctx context.Context, id string) (CloudImage, error)
	// List returns every image whose properties include all of match.
	List(ctx context.Context, match map[string]string) ([]CloudImage, error)
	// Delete removes an image; deleting one that does not exist is not an error.
	Delete(ctx context.Context, id string) error
	// Project is the project the cloud's credentials act for, which owns the
	// images they create; "" when there is none to tell (no authentication,
	// credentials of no project).
	Project(ctx context.Context) (string, error)
}

// Importer is a Cloud that also takes images by Glance's interoperable
// import, for a provider whose upload-method asks for it.
type Importer interface {
	// ImportMethods lists the methods of import the cloud offers.
	ImportMethods(ctx context.Context) ([]string, error)
	// CheckImportMethod is nil when the cloud offers the import method, and
	// an error that names what it offers when it does not.
	CheckImportMethod(ctx context.Context, method string) error
	// Stage streams size bytes of data into the image's staging area, as
	// Upload does into the image (a negative size: unknown).
	Stage(ctx context.Context, id string, data io.Reader, size int64) error
	// Import has the cloud import the image by method: glance-direct for
	// what Stage staged, web-download for what it fetches at uri itself. It
	// returns once the import is under way.
	Import(ctx context.Context, id, method, uri string) error
	// ImportFailure says why the image's last import failed, "" while it
	// has not.
	ImportFailure(ctx context.Context, id string) (string, error)
}
