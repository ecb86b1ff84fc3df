package gcp

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Reasons (googleapi.ErrorItem.Reason) that decide a class regardless of the
// HTTP code. Compute Engine answers both an exhausted quota and an API rate
// limit with 403; only the reason tells "wait a second" from "raise the
// quota".
var (
	transientReasons = map[string]bool{
		"rateLimitExceeded":     true,
		"userRateLimitExceeded": true,
		"backendError":          true,
		"internalError":         true,
		// An instance mid-transition (e.g. being deleted) refuses another
		// mutation with 400 resourceNotReady; it clears by itself.
		"resourceNotReady":               true,
		"resourceInUseByAnotherResource": true,
	}
	permanentReasons = map[string]bool{
		"quotaExceeded":       true,
		"limitExceeded":       true,
		"forbidden":           true,
		"accessNotConfigured": true,
		"invalid":             true,
		"required":            true,
		"badRequest":          true,
		// 412: an organisation policy (constraints/compute.vmExternalIpAccess,
		// requireShieldedVm, ...) refuses the request. It holds until an
		// administrator changes the policy or the Proxy. (A stale
		// fingerprint is also 412, but this provider sends none.)
		"conditionNotMet": true,
	}
)

// classify wraps err from the Compute API with the class the controller acts
// on. what names the call, for the message.
func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	if provider.HasClass(err) {
		return err
	}
	wrapped := fmt.Errorf("gcp: %s: %w", what, err)
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		// Transport failures, token refresh failures, context deadlines:
		// nothing says retrying is futile.
		return provider.Transient(wrapped)
	}
	if ge.Code == http.StatusNotFound {
		return provider.NotFound(wrapped)
	}
	for _, it := range ge.Errors {
		if transientReasons[it.Reason] {
			return provider.Transient(wrapped)
		}
	}
	for _, it := range ge.Errors {
		if permanentReasons[it.Reason] {
			return provider.Permanent(wrapped)
		}
	}
	return classifyHTTP(ge.Code, wrapped)
}

// classifyHTTP classes by status code alone.
func classifyHTTP(code int, err error) error {
	switch {
	case code == http.StatusNotFound:
		return provider.NotFound(err)
	case code == http.StatusTooManyRequests, code == http.StatusRequestTimeout,
		code == http.StatusConflict,
		code >= 500, code == 0:
		return provider.Transient(err)
	case code >= 400:
		// 400 invalid, 401 bad credentials, 403 denied, 412 policy
		// violated: the same request will be refused again.
		return provider.Permanent(err)
	default:
		return provider.Transient(err)
	}
}

// isAlreadyExists reports a 409 on insert.
func isAlreadyExists(err error) bool {
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != http.StatusConflict {
		return false
	}
	if len(ge.Errors) == 0 {
		return true
	}
	for _, it := range ge.Errors {
		if it.Reason == "alreadyExists" {
			return true
		}
	}
	return false
}

// Operation error codes (compute.OperationErrorErrors.Code) that are worth
// retrying: capacity and rate, not the request itself.
var transientOpCodes = map[string]bool{
	"ZONE_RESOURCE_POOL_EXHAUSTED":              true,
	"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": true,
	"RESOURCE_NOT_READY":                        true,
	"RESOURCE_OPERATION_RATE_EXCEEDED":          true,
	"RATE_LIMIT_EXCEEDED":                       true,
	"INTERNAL_ERROR":                            true,
	"SERVICE_UNAVAILABLE":                       true,
	"UNAVAILABLE":                               true,
	"TIMEOUT":                                   true,
}

var permanentOpCodes = map[string]bool{
	"QUOTA_EXCEEDED":        true,
	"INVALID_FIELD_VALUE":   true,
	"INVALID_USAGE":         true,
	"BAD_REQUEST":           true,
	"PERMISSIONS_ERROR":     true,
	"FORBIDDEN":             true,
	"UNSUPPORTED_OPERATION": true,
	"CONDITION_NOT_MET":     true,
}

// operationError returns the classified error of a DONE operation, or nil.
func operationError(op *compute.Operation) error {
	if op.Error == nil || len(op.Error.Errors) == 0 {
		return nil
	}
	var codes, msgs []string
	for _, e := range op.Error.Errors {
		codes = append(codes, e.Code)
		msg := e.Message
		if d := errorDetails(e.ErrorDetails); d != "" {
			msg += " (" + d + ")"
		}
		msgs = append(msgs, msg)
	}
	err := fmt.Errorf("gcp: operation %s (%s %s) failed: %s: %s",
		op.Name, op.OperationType, lastSegment(op.TargetLink), strings.Join(codes, ","), strings.Join(msgs, "; "))
	for _, c := range codes {
		if c == "RESOURCE_NOT_FOUND" {
			return provider.NotFound(err)
		}
	}
	for _, c := range codes {
		if c == "ZONE_RESOURCE_POOL_EXHAUSTED" || c == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" {
			// The zone, not the request: another zone may have room.
			return provider.NoCapacity(err)
		}
	}
	for _, c := range codes {
		if transientOpCodes[c] {
			return provider.Transient(err)
		}
	}
	for _, c := range codes {
		if permanentOpCodes[c] {
			return provider.Permanent(err)
		}
	}
	return classifyHTTP(int(op.HttpErrorStatusCode), err)
}

// errorDetails renders an operation error's details for the Proxy
// condition: for ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS they say which
// zones or machine types have capacity, which is what a user acts on.
func errorDetails(details []*compute.OperationErrorErrorsErrorDetails) string {
	var out []string
	for _, d := range details {
		if d == nil {
			continue
		}
		if i := d.ErrorInfo; i != nil {
			s := i.Reason
			keys := make([]string, 0, len(i.Metadatas))
			for k := range i.Metadatas {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				s += " " + k + "=" + i.Metadatas[k]
			}
			out = append(out, strings.TrimSpace(s))
		}
		if q := d.QuotaInfo; q != nil {
			out = append(out, fmt.Sprintf("quota %s limit %g", q.MetricName, q.Limit))
		}
		if l := d.LocalizedMessage; l != nil && l.Message != "" {
			out = append(out, l.Message)
		}
		if h := d.Help; h != nil {
			for _, l := range h.Links {
				out = append(out, "see "+l.Url)
			}
		}
	}
	return strings.Join(out, "; ")
}
