package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Fetcher opens the image at rawURL for reading. size is the length of the
// body in bytes, or -1 when the source does not say. The body must stop
// (return an error) once ctx is done: that is how a stalled or abandoned
// download is interrupted. Returned errors should be classified (see
// provider.Class); unclassified ones count as transient.
type Fetcher func(ctx context.Context, rawURL string) (body io.ReadCloser, size int64, err error)

// HTTPStatusError is a response other than 200 OK.
type HTTPStatusError struct {
	// URL is the requested URL, safe to show (see provider.RedactURL).
	URL        string
	StatusCode int
	Status     string
}

func (e *HTTPStatusError) Error() string {
	return fmt.Sprintf("GET %s: %s", e.URL, e.Status)
}

// classifyStatus decides whether a status is worth retrying. Client errors
// say the URL is wrong (404, 403, 410, ...), except those that mean "not
// now": 408, 425 and 429. Server errors are the server's trouble, which it
// may get over.
func classifyStatus(err *HTTPStatusError) error {
	switch c := err.StatusCode; {
	case c >= 500, c == http.StatusRequestTimeout, c == http.StatusTooEarly, c == http.StatusTooManyRequests:
		return provider.Transient(err)
	default:
		return provider.Permanent(err)
	}
}

// checkURL accepts absolute http and https URLs only.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return provider.Permanentf("image URL is invalid: %w", err)
	}
	switch u.Scheme {
	case "http", "https":
	default:
		return provider.Permanentf("image URL %s: scheme %q is not supported; want http or https", provider.RedactURL(raw), u.Scheme)
	}
	if u.Host == "" {
		return provider.Permanentf("image URL %s has no host", provider.RedactURL(raw))
	}
	return nil
}

// defaultHTTPClient is shared by every Cache without its own client so
// connections are reused. There is no overall timeout: a multi-gigabyte
// download may take long; stalls are caught by Cache.StallTimeout instead.
var defaultHTTPClient = &http.Client{Transport: newTransport()}

func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// Images are compressed already; a transparently gunzipped body would
	// also lose its Content-Length, which sizes the volume.
	t.DisableCompression = true
	t.ResponseHeaderTimeout = time.Minute
	return t
}

// httpFetcher fetches with client.
func httpFetcher(client *http.Client) Fetcher {
	return func(ctx context.Context, rawURL string) (io.ReadCloser, int64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
		if err != nil {
			return nil, 0, provider.Permanentf("image URL %s: %w", provider.RedactURL(rawURL), err)
		}
		req.Header.Set("User-Agent", "proxy-operator-image-cache")
		resp, err := client.Do(req)
		if err != nil {
			// *url.Error repeats the full URL; say it once, redacted.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, 0, provider.Transientf("GET %s: %w", provider.RedactURL(rawURL), err)
		}
		if resp.StatusCode != http.StatusOK {
			// A little of the body lets the connection be reused; error
			// pages are small, and an image is never drained here.
			_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
			_ = resp.Body.Close()
			return nil, 0, classifyStatus(&HTTPStatusError{URL: provider.RedactURL(rawURL), StatusCode: resp.StatusCode, Status: resp.Status})
		}
		return resp.Body, resp.ContentLength, nil
	}
}
