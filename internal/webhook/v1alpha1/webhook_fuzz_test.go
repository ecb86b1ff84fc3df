package v1alpha1

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

// admitter is what the API server calls for one kind: Default, then the
// validating webhook on create and on a no-op update.
type admitter[T any] interface {
	Default(context.Context, T) error
	ValidateCreate(context.Context, T) (admission.Warnings, error)
	ValidateUpdate(ctx context.Context, old, obj T) (admission.Warnings, error)
}

// fuzzAdmission decodes an object from the fuzzer's JSON and checks what the
// webhooks promise for any input: no panic; defaulting is idempotent (the
// API server may call it again on an update); validating a defaulted object
// twice gives the same answer; a valid object stays valid on an update that
// changes nothing.
func fuzzAdmission[T any](f *testing.F, samples []string, newObj func() T, w admitter[T]) {
	for _, s := range samples {
		f.Add([]byte(s))
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		obj := newObj()
		if err := json.Unmarshal(data, obj); err != nil {
			return
		}
		if err := w.Default(ctx, obj); err != nil {
			t.Fatalf("Default: %v", err)
		}
		twice := deepCopy(t, obj)
		if err := w.Default(ctx, twice); err != nil {
			t.Fatalf("second Default: %v", err)
		}
		if !equality.Semantic.DeepEqual(obj, twice) {
			t.Fatalf("Default is not idempotent:\nonce:  %+v\ntwice: %+v", obj, twice)
		}
		_, err1 := w.ValidateCreate(ctx, obj)
		_, err2 := w.ValidateCreate(ctx, deepCopy(t, obj))
		if fmt.Sprint(err1) != fmt.Sprint(err2) {
			t.Fatalf("validation is not deterministic:\n%v\n%v", err1, err2)
		}
		if _, err := w.ValidateUpdate(ctx, deepCopy(t, obj), obj); err1 == nil && err != nil {
			t.Fatalf("a valid object is refused on an update that changes nothing: %v", err)
		}
	})
}

// deepCopy round-trips through JSON, as the API server stores objects.
func deepCopy[T any](t *testing.T, obj T) T {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	out := new(T)
	// T is a pointer type; unmarshal into a fresh value of the pointee.
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return *out
}

// sampleJSON returns the shipped sample of a kind as JSON: the seeds start
// from what users really apply.
func sampleJSON(f *testing.F, file string) string {
	f.Helper()
	y, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "samples", file))
	if err != nil {
		f.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		f.Fatal(err)
	}
	return string(j)
}

func FuzzProxyAdmission(f *testing.F) {
	fuzzAdmission(f, []string{
		sampleJSON(f, "crawl_v1alpha1_proxy.yaml"),
		`{"metadata":{"name":"p"},"spec":{"provider":"kubernetes"}}`,
		`{"metadata":{"name":"p"},"spec":{"provider":"gcp","placement":{"zone":"europe-west1-b"},"cloudInit":{"userData":"#cloud-config\n"}}}`,
		`{"metadata":{"name":"p"},"spec":{"provider":"kvm","port":0,"placement":{"hostSelector":{"matchLabels":{"a":"b"}},"image":"https://h/i.qcow2","imageChecksum":"sha256:00"}}}`,
		`{"metadata":{"name":"Bad_Name"},"spec":{"provider":"kvm","resources":{"cpus":-1,"memory":"1Ki"}}}`,
		`{"metadata":{"name":"p"},"spec":{"provider":"kubernetes","access":{"allowedSourceCIDRs":["10.0.0.0/8","0.0.0.0/0","::/0"],"allowedPorts":[0,443],"auth":{"type":"None","secretRef":{"name":"p-proxy-credentials"}}}}}`,
		`{"metadata":{"name":"p"},"spec":{"provider":"kubernetes","access":{"managed":false,"maxConnectionsPerClient":-3,"allowedDestinationExceptions":["10.1.0.0/16"],"extraDeniedDestinations":["10.0.0.0/8"]}}}`,
		`{"metadata":{"name":"p"},"spec":{"provider":"gcp","access":{"managed":true,"auth":{}}}}`,
	}, func() *crawlv1.Proxy { return &crawlv1.Proxy{} }, proxyWebhook(false))
}

func FuzzKVMHostAdmission(f *testing.F) {
	fuzzAdmission(f, []string{
		sampleJSON(f, "crawl_v1alpha1_kvmhost.yaml"),
		`{"metadata":{"name":"h"},"spec":{"address":"[fd00::1]","checkInterval":"12s","checkTimeout":"0s"}}`,
		`{"metadata":{"name":"h"},"spec":{"address":"h:99999","checkInterval":"1s","checkTimeout":"2s"}}`,
	}, func() *crawlv1.KVMHost { return &crawlv1.KVMHost{} }, &KVMHostWebhook{})
}

func FuzzKVMImageAdmission(f *testing.F) {
	fuzzAdmission(f, []string{
		sampleJSON(f, "crawl_v1alpha1_kvmimage.yaml"),
		`{"metadata":{"name":"i"},"spec":{"url":"https://user:pw@h/i.qcow2","checksum":"sha256:0123"}}`,
		`{"metadata":{"name":"i"},"spec":{"url":"file:///etc/passwd","format":"raw","firmware":"bios"}}`,
	}, func() *crawlv1.KVMImage { return &crawlv1.KVMImage{} }, &KVMImageWebhook{})
}

// noDefaults admits like a webhook that validates only: the API server
// calls no defaulting webhook for ProxyPools.
type noDefaults struct{ *ProxyPoolWebhook }

func (noDefaults) Default(context.Context, *crawlv1.ProxyPool) error { return nil }

func FuzzProxyPoolAdmission(f *testing.F) {
	fuzzAdmission(f, []string{
		sampleJSON(f, "crawl_v1alpha1_proxypool.yaml"),
		`{"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"provider":"kubernetes"}},"rollout":{"maxSurge":0,"maxUnavailable":"0%"}}}`,
		`{"metadata":{"name":"p"},"spec":{"selector":{"matchExpressions":[{"key":"a","operator":"In","values":["b"]}]},"template":{"metadata":{"labels":{"a":"c"}},"spec":{"provider":"gcp"}},"placement":{"zones":["z","z",""]}}}`,
		`{"metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"spec":{"provider":"kvm","placement":{"image":"https://h/i"}}},"rotation":{"jitter":"1h","maxAge":"30m"},"remediation":{"maxUnhealthy":"140%","startupTimeout":"-1s"}}}`,
	}, func() *crawlv1.ProxyPool { return &crawlv1.ProxyPool{} }, noDefaults{poolWebhook()})
}
