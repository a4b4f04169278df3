package openstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imageimport"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
)

// The methods of Glance's interoperable import the builder knows.
const (
	// GlanceDirect imports the data Stage staged.
	GlanceDirect = "glance-direct"
	// WebDownload has Glance fetch the data from a URL itself.
	WebDownload = "web-download"
)

// ImportMethods lists the methods of interoperable import the cloud offers, as
// Glance's discovery (GET /v2/info/import) says; none when it offers none.
func (c *Cloud) ImportMethods(ctx context.Context) ([]string, error) {
	sc, err := c.imageService(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the import methods: %w", err)
	}
	info, err := imageimport.Get(ctx, sc).Extract()
	if err != nil {
		return nil, fmt.Errorf("read the import methods of cloud %s: %w", c.name, c.classify(err))
	}
	return info.ImportMethods.Value, nil
}

// ImportMethodError is a method of import asked of a cloud that does not offer it.
type ImportMethodError struct {
	Cloud, Method string
	// Offered are the methods the cloud offers.
	Offered []string
}

func (e *ImportMethodError) Error() string {
	offers := "it offers none"
	if len(e.Offered) > 0 {
		offers = "it offers " + strings.Join(e.Offered, ", ")
	}
	return fmt.Sprintf("cloud %s does not offer the image import method %q: %s", e.Cloud, e.Method, offers)
}

// CheckImportMethod is nil when the cloud offers the method of import, and an
// *ImportMethodError, which names what it offers, when it does not.
func (c *Cloud) CheckImportMethod(ctx context.Context, method string) error {
	offered, err := c.ImportMethods(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(offered, method) {
		return nil
	}
	return &ImportMethodError{Cloud: c.name, Method: method, Offered: offered}
}

// Stage streams size bytes from data into the image's staging area, for
// Import by GlanceDirect; the image goes from queued to uploading. It sends
// the data as Upload does, with the same care for a token Glance refuses. A
// cloud that does not offer glance-direct is an *ImportMethodError before any
// data moves: Glance would refuse the PUT with a 404, which reads as a
// missing image.
func (c *Cloud) Stage(ctx context.Context, id string, data io.Reader, size int64) error {
	if id == "" {
		return fmt.Errorf("stage in cloud %s: no image id", c.name)
	}
	what := fmt.Sprintf("stage image %s in cloud %s", id, c.name)
	if err := c.CheckImportMethod(ctx, GlanceDirect); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return c.sendData(ctx, id, "stage", what, data, size)
}

// Import asks Glance to import the image by method: GlanceDirect for the data
// Stage staged, WebDownload to fetch uri itself, which only that method takes.
// Glance answers at once and imports in the background: the image turns
// importing, then active, or the import fails, which ImportFailure tells. A
// method the cloud does not offer is an *ImportMethodError.
func (c *Cloud) Import(ctx context.Context, id, method, uri string) error {
	if id == "" {
		return fmt.Errorf("import in cloud %s: no image id", c.name)
	}
	what := fmt.Sprintf("import image %s by %s in cloud %s", id, method, c.name)
	switch {
	case method == WebDownload && uri == "":
		return fmt.Errorf("%s: no URL to fetch", what)
	case method != WebDownload && uri != "":
		return fmt.Errorf("%s: only web-download takes a URL", what)
	}
	sc, err := c.imageService(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	err = imageimport.Create(ctx, sc, id, importRequest{method: method, uri: uri}).ExtractErr()
	if err == nil {
		c.log.Debug("import started", "id", id, "method", method, "uri", redact.URL(uri))
		return nil
	}
	if gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		// Glance refuses a method it does not offer as it does any bad request;
		// its discovery tells which this was.
		var notOffered *ImportMethodError
		if errors.As(c.CheckImportMethod(ctx, method), &notOffered) {
			return fmt.Errorf("%s: %w", what, notOffered)
		}
	}
	return fmt.Errorf("%s: %w", what, c.getError(err))
}

// importRequest is the body of POST /v2/images/{id}/import. It holds a uri
// only when there is one: gophercloud's CreateOpts sends an empty one with
// every method.
type importRequest struct {
	method, uri string
}

// ToImportCreateMap implements imageimport.CreateOptsBuilder.
func (r importRequest) ToImportCreateMap() (map[string]any, error) {
	m := map[string]any{"name": r.method}
	if r.uri != "" {
		m["uri"] = r.uri
	}
	return map[string]any{"method": m}, nil
}

// Properties Glance keeps its import's progress in.
const (
	// failedImportProperty lists the stores an import failed to put the image in.
	failedImportProperty = "os_glance_failed_import"
	// importingProperty lists the stores an import is putting the image in.
	importingProperty = "os_glance_importing_to_stores"
)

// imageTask is a task of GET /v2/images/{id}/tasks.
type imageTask struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Status  string `json:"status"`
	Message string `json:"message"`
	// CreatedAt is Glance's time without a zone, e.g. 2024-05-01T10:00:00.123456.
	CreatedAt string `json:"created_at"`
	Input     struct {
		ImportReq struct {
			Method struct {
				Name string `json:"name"`
			} `json:"method"`
		} `json:"import_req"`
	} `json:"input"`
}

// importTaskType is the type of the task an import runs as.
const importTaskType = "api_image_import"

// ImportFailure says why the image's last import failed, in Glance's words, or
// "" when it has not failed: it may still run, or have succeeded. Glance's
// words are the message of the import's task (GET /v2/images/{id}/tasks) and
// the stores os_glance_failed_import and os_glance_importing_to_stores name;
// the reason gives the task's id as well, under which Glance logs the cause:
// of most failures, Glance 25's message says only "Task failed due to
// Internal Error". A failed import does not always send the image back to
// queued (a conversion that fails leaves it importing), so whoever waits for
// an import asks this rather than wait for the image to leave importing.
func (c *Cloud) ImportFailure(ctx context.Context, id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("read the import of an image in cloud %s: no image id", c.name)
	}
	what := fmt.Sprintf("read the import of image %s in cloud %s", id, c.name)
	sc, err := c.imageService(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	img, err := images.Get(ctx, sc, id).Extract()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, c.getError(err))
	}
	var doc struct {
		Tasks []imageTask `json:"tasks"`
	}
	if _, err := sc.Get(ctx, sc.ServiceURL("images", id, "tasks"), &doc, nil); err != nil {
		return "", fmt.Errorf("%s: %w", what, c.getError(err))
	}
	var reasons []string
	if last := lastImport(doc.Tasks); last != nil && last.Status == "failure" {
		msg := strings.TrimSpace(last.Message)
		if msg == "" {
			msg = "Glance gave no reason"
		}
		reasons = append(reasons, fmt.Sprintf("Glance's import task %s (%s) failed: %s", last.ID, last.Input.ImportReq.Method.Name, msg))
	}
	if stores, _ := img.Properties[failedImportProperty].(string); stores != "" {
		reasons = append(reasons, fmt.Sprintf("the import failed in the stores %s (%s)", stores, failedImportProperty))
	}
	if stores, _ := img.Properties[importingProperty].(string); stores != "" && len(reasons) > 0 {
		reasons = append(reasons, fmt.Sprintf("it had yet to reach the stores %s (%s)", stores, importingProperty))
	}
	return strings.Join(reasons, "; "), nil
}

// lastImport is the import task created last, nil when there is none.
func lastImport(tasks []imageTask) *imageTask {
	var last *imageTask
	var lastAt time.Time
	for i := range tasks {
		t := &tasks[i]
		if t.Type != importTaskType {
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.999999", strings.TrimSuffix(t.CreatedAt, "Z"))
		if err != nil {
			// A time Glance did not write as it does counts as the oldest.
			at = time.Time{}
		}
		if last == nil || at.After(lastAt) {
			last, lastAt = t, at
		}
	}
	return last
}
