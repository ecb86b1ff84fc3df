package deploy

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
	"crawl.example.com/proxy-operator/controllers"
	webhookv1 "crawl.example.com/proxy-operator/internal/webhook/v1alpha1"
	"crawl.example.com/proxy-operator/test/envtestutil"
)

// The two variable forms clusterctl (drone/envsubst) and a8m/envsubst both
// read the same way: ${VAR} and ${VAR:=default}.
var varRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::=([^}$]*))?\}`)

// templateVar is one variable of a template; Default is meaningful only
// when Optional.
type templateVar struct {
	Optional bool
	Default  string
}

// templateVars returns the variables of src. Any other use of '$' is an
// error: its meaning would differ between renderers.
func templateVars(src string) (map[string]templateVar, error) {
	vars := map[string]templateVar{}
	for i, line := range strings.Split(src, "\n") {
		if rest := varRef.ReplaceAllString(line, ""); strings.Contains(rest, "$") {
			return nil, fmt.Errorf("line %d: '$' outside ${VAR} or ${VAR:=default}: %q", i+1, line)
		}
		for _, m := range varRef.FindAllStringSubmatch(line, -1) {
			v := templateVar{Optional: strings.Contains(m[0], ":="), Default: m[2]}
			if prev, ok := vars[m[1]]; ok && prev != v {
				return nil, fmt.Errorf("line %d: %s used with two defaults (%+v, %+v)", i+1, m[1], prev, v)
			}
			vars[m[1]] = v
		}
	}
	return vars, nil
}

// renderTemplate substitutes env into src the way clusterctl does: a set,
// non-empty value wins, then the default; a variable with neither is an
// error naming every such variable.
func renderTemplate(src string, env map[string]string) (string, error) {
	if _, err := templateVars(src); err != nil {
		return "", err
	}
	missing := map[string]bool{}
	out := varRef.ReplaceAllStringFunc(src, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		if v := env[m[1]]; v != "" {
			return v
		}
		if strings.Contains(ref, ":=") {
			return m[2]
		}
		missing[m[1]] = true
		return ""
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("value for variables %v is not set", slices.Sorted(maps.Keys(missing)))
	}
	return out, nil
}

// documentedVars reads templates/README.md: for each "## `FILE`" section,
// the rows "| `VAR` | meaning | default |", where default is "required" or
// a `value`.
func documentedVars(t *testing.T) map[string]map[string]templateVar {
	t.Helper()
	section := regexp.MustCompile("^## `([^`]+\\.yaml)`")
	row := regexp.MustCompile("^\\| `([A-Z0-9_]+)` \\|.*\\| (required|`[^`]*`) \\|$")
	docs := map[string]map[string]templateVar{}
	var current string
	sc := bufio.NewScanner(strings.NewReader(readFile(t, "templates/README.md")))
	for sc.Scan() {
		line := sc.Text()
		if m := section.FindStringSubmatch(line); m != nil {
			current = m[1]
			docs[current] = map[string]templateVar{}
			continue
		}
		if strings.HasPrefix(line, "## ") {
			current = ""
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil && current != "" {
			v := templateVar{}
			if m[2] != "required" {
				v = templateVar{Optional: true, Default: strings.Trim(m[2], "`")}
			}
			docs[current][m[1]] = v
		}
	}
	return docs
}

// exampleValues fill the required variables; the defaults fill the rest.
var exampleValues = map[string]string{
	"KVMHOST_NAME":                "hv1",
	"KVMHOST_ADDRESS":             "hv1.lan",
	"KVMHOST_SSH_PRIVATE_KEY_B64": base64.StdEncoding.EncodeToString([]byte("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n")),
	"KVMHOST_KNOWN_HOSTS_B64":     base64.StdEncoding.EncodeToString([]byte("hv1.lan ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholderPlaceholderPlaceholderPlace\n")),
	"DEBIAN_IMAGE_SHA256":         strings.Repeat("0123456789abcdef", 4),
	"PROXY_NAME":                  "egress-1",
	"PROXY_ALLOWED_SOURCE_CIDRS":  "10.244.0.0/16, 192.0.2.0/24",
	"POOL_NAME":                   "crawl-a",
	"GCP_PROJECT":                 "crawl-project",
	"GCP_ZONE":                    "europe-west1-b",
}

func templateFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(envtestutil.Root(), "templates", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{"kvmhost.yaml", "kvmimage-debian.yaml", "proxy-gcp.yaml", "proxy-kubernetes.yaml", "proxy-kvm.yaml", "proxypool-kvm.yaml"}
	if !slices.Equal(names, want) {
		t.Errorf("templates/ holds %v, want %v", names, want)
	}
	return names
}

// TestTemplatesDocumented: every variable of every template is in
// templates/README.md with the template's default, and nothing else is.
func TestTemplatesDocumented(t *testing.T) {
	docs := documentedVars(t)
	files := templateFiles(t)
	for name := range docs {
		if !slices.Contains(files, name) {
			t.Errorf("templates/README.md documents %s, which does not exist", name)
		}
	}
	for _, name := range files {
		vars, err := templateVars(readFile(t, "templates/"+name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		doc, ok := docs[name]
		if !ok {
			t.Errorf("templates/README.md has no section for %s", name)
			continue
		}
		for v, tv := range vars {
			switch dv, ok := doc[v]; {
			case !ok:
				t.Errorf("%s: variable %s is not documented", name, v)
			case dv != tv:
				t.Errorf("%s: %s documented as %s, template says %s", name, v, describe(dv), describe(tv))
			}
		}
		for v := range doc {
			if _, ok := vars[v]; !ok {
				t.Errorf("%s: documented variable %s is not used", name, v)
			}
		}
	}
}

func describe(v templateVar) string {
	if !v.Optional {
		return "required"
	}
	return fmt.Sprintf("default %q", v.Default)
}

// TestTemplatesValidate renders every template with its documented
// variables and sends the result to the API server (dryRun=All, CRD schema
// and CEL), then through the webhooks' defaulting and validation.
func TestTemplatesValidate(t *testing.T) {
	c, w := apiServer(t)
	ctx := t.Context()
	docs := documentedVars(t)
	for _, name := range templateFiles(t) {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{}
			for v, tv := range docs[name] {
				if !tv.Optional {
					val, ok := exampleValues[v]
					if !ok {
						t.Fatalf("no example value for required variable %s", v)
					}
					env[v] = val
				}
			}
			out, err := renderTemplate(readFile(t, "templates/"+name), env)
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeYAML(t, out)
			if len(objs) == 0 {
				t.Fatal("renders no objects")
			}
			for _, o := range objs {
				if ns := namespaceOf(o); ns != nil {
					ensureNamespace(ctx, t, c, ns)
				}
				w.take()
				if err := dryRunApply(ctx, c, o); err != nil {
					t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
				}
				for _, msg := range w.take() {
					t.Errorf("%s %s: server warning: %s", o.GetKind(), o.GetName(), msg)
				}
				if errs := webhookErrors(t, o); len(errs) > 0 {
					t.Errorf("%s %s: webhook validation: %v", o.GetKind(), o.GetName(), errs.ToAggregate())
				}
			}
		})
	}
}

// TestRenderTemplate pins the substitution rules the tests rely on.
func TestRenderTemplate(t *testing.T) {
	src := readFile(t, "templates/kvmhost.yaml")
	_, err := renderTemplate(src, nil)
	if err == nil || !strings.Contains(err.Error(), "KVMHOST_NAME") || !strings.Contains(err.Error(), "KVMHOST_ADDRESS") {
		t.Errorf("rendering without required variables: err = %v, want one naming KVMHOST_NAME and KVMHOST_ADDRESS", err)
	}
	for _, tc := range []struct {
		src, want string
		env       map[string]string
		wantErr   bool
	}{
		{src: "a: ${A:=x}", want: "a: x"},
		{src: "a: ${A:=x}", env: map[string]string{"A": "y"}, want: "a: y"},
		{src: "a: ${A:=x}", env: map[string]string{"A": ""}, want: "a: x"},
		{src: "a: ${A}-${B:=b}", env: map[string]string{"A": "y"}, want: "a: y-b"},
		{src: "a: ${A}", wantErr: true},
		{src: "a: $A", env: map[string]string{"A": "y"}, wantErr: true},
		{src: "a: ${A:-x}", wantErr: true},
		{src: "a: ${A:=x} ${A:=y}", wantErr: true},
	} {
		got, err := renderTemplate(tc.src, tc.env)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("renderTemplate(%q, %v) = %q, %v; want %q, error %v", tc.src, tc.env, got, err, tc.want, tc.wantErr)
		}
	}
}

func decodeYAML(t *testing.T, s string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(s), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decode rendered YAML: %v", err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// webhookErrors runs the admission webhooks' defaulting and validation on a
// crawl.example.com object (webhooks are not installed in this envtest).
func webhookErrors(t *testing.T, o *unstructured.Unstructured) field.ErrorList {
	t.Helper()
	// As main.go builds it with its default flags.
	proxyWebhook := &webhookv1.ProxyWebhook{Plugins: controllers.Plugins()}
	convert := func(into any) {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	switch o.GetKind() {
	case "KVMHost":
		h := &crawlv1.KVMHost{}
		convert(h)
		webhookv1.DefaultKVMHost(h)
		return webhookv1.ValidateKVMHost(h)
	case "KVMImage":
		img := &crawlv1.KVMImage{}
		convert(img)
		webhookv1.DefaultKVMImage(img)
		return webhookv1.ValidateKVMImage(img)
	case "Proxy":
		p := &crawlv1.Proxy{}
		convert(p)
		proxyWebhook.DefaultProxy(p)
		return proxyWebhook.ValidateProxy(p)
	case "ProxyPool":
		// Each replica must pass the Proxy webhook: check one as the pool
		// would create it (the pool places it on a host).
		pool := &crawlv1.ProxyPool{}
		convert(pool)
		p := &crawlv1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: pool.Name + "-x7k2p", Namespace: pool.Namespace}, Spec: *pool.Spec.Template.Spec.DeepCopy()}
		proxyWebhook.DefaultProxy(p)
		return proxyWebhook.ValidateProxy(p)
	}
	return nil
}
