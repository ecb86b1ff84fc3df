package controllers

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/cache"
)

func TestParseNamespaces(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "", want: nil},
		{in: " , ", want: nil},
		{in: "crawl", want: []string{"crawl"}},
		{in: "crawl-a, crawl-b", want: []string{"crawl-a", "crawl-b"}},
		{in: "crawl,Crawl", wantErr: `--namespaces: "Crawl" is not a namespace name`},
		{in: "a/b", wantErr: `--namespaces: "a/b" is not a namespace name`},
		{in: "a,b,a", wantErr: `--namespaces: namespace "a" is listed twice`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseNamespaces(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseNamespaces(%q) = %v, %v; want error %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ParseNamespaces(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestServeNamespaces(t *testing.T) {
	var base cache.Options
	if got := ServeNamespaces(base, nil); got.DefaultNamespaces != nil {
		t.Errorf("no namespaces: DefaultNamespaces %v, want nil (every namespace)", got.DefaultNamespaces)
	}
	got := ServeNamespaces(base, []string{"a", "b"})
	if keys := slices.Sorted(maps.Keys(got.DefaultNamespaces)); !slices.Equal(keys, []string{"a", "b"}) {
		t.Errorf("DefaultNamespaces %v, want a and b", keys)
	}
}
