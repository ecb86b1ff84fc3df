package domxml

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The garbage-collection contract lives in the domain's <metadata> as one
// element in our namespace:
//
//	<proxy:instance xmlns:proxy="https://crawl.example.com/proxy-operator/v1alpha1">
//	  <proxy:managed-by>proxy-operator</proxy:managed-by>
//	  <proxy:namespace>NS</proxy:namespace>
//	  <proxy:name>NAME</proxy:name>
//	  <proxy:uid>UID</proxy:uid>
//	  <proxy:tag>TAG</proxy:tag>
//	  <proxy:install>INSTALL-ID</proxy:install>
//	</proxy:instance>
//
// install is the operator install that made the domain (absent on domains
// made before install ids); the orphan sweep only deletes its own install's.
const (
	// MetadataNS is the namespace URI; it is also the uri argument of
	// virDomainGetMetadata/SetMetadata.
	MetadataNS = "https://crawl.example.com/proxy-operator/v1alpha1"
	// MetadataPrefix is the prefix we write (the key of SetMetadata).
	MetadataPrefix = "proxy"
	// MetadataElement is the local name of our element.
	MetadataElement = "instance"
	// ManagedBy is the managed-by value of domains this operator made.
	ManagedBy = "proxy-operator"
)

// Metadata is what a domain records about the Proxy that owns it.
type Metadata struct {
	ManagedBy string
	Namespace string
	Name      string
	UID       string
	Tag       string
	InstallID string
}

// instanceXML decodes our element by local names only: encoding/xml matches
// a tag without a namespace against any namespace, so the prefixed element
// as written, a default-namespace form and the bare form DomainGetMetadata
// returns all fit.
type instanceXML struct {
	XMLName   xml.Name `xml:"instance"`
	ManagedBy string   `xml:"managed-by"`
	Namespace string   `xml:"namespace"`
	Name      string   `xml:"name"`
	UID       string   `xml:"uid"`
	Tag       string   `xml:"tag"`
	InstallID string   `xml:"install"`
}

func (x instanceXML) metadata() (Metadata, error) {
	m := Metadata{
		ManagedBy: strings.TrimSpace(x.ManagedBy),
		Namespace: strings.TrimSpace(x.Namespace),
		Name:      strings.TrimSpace(x.Name),
		UID:       strings.TrimSpace(x.UID),
		Tag:       strings.TrimSpace(x.Tag),
		InstallID: strings.TrimSpace(x.InstallID),
	}
	if m.UID == "" {
		return Metadata{}, errors.New("domain metadata: <instance> has no uid")
	}
	return m, nil
}

// XML returns the element as it goes into <metadata>, prefixed and carrying
// its own namespace declaration (libvirt wants each top-level metadata
// element in a namespace of its own, and keeps the prefix we give).
// encoding/xml cannot emit a chosen prefix, so the element is written by
// hand around escaped values.
func (m Metadata) XML() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "<%s:%s xmlns:%s=%q>", MetadataPrefix, MetadataElement, MetadataPrefix, MetadataNS)
	for _, f := range []struct{ local, value string }{
		{"managed-by", m.ManagedBy},
		{"namespace", m.Namespace},
		{"name", m.Name},
		{"uid", m.UID},
		{"tag", m.Tag},
		{"install", m.InstallID},
	} {
		fmt.Fprintf(&b, "<%s:%s>", MetadataPrefix, f.local)
		_ = xml.EscapeText(&b, []byte(f.value)) // a bytes.Buffer never fails
		fmt.Fprintf(&b, "</%s:%s>", MetadataPrefix, f.local)
	}
	fmt.Fprintf(&b, "</%s:%s>", MetadataPrefix, MetadataElement)
	return b.String()
}

// ParseMetadata parses our element, matching names by local name so it
// accepts both the prefixed element as written and the namespace-less form
// virDomainGetMetadata returns (e.g. libvirt 11.6:
// "<instance><uid>...</uid>...</instance>"). Anything else, or an element
// without a uid, is an error.
func ParseMetadata(s string) (Metadata, error) {
	var x instanceXML
	if err := xml.Unmarshal([]byte(s), &x); err != nil {
		return Metadata{}, fmt.Errorf("domain metadata: %w", err)
	}
	return x.metadata()
}

// MetadataFromDomainXML finds our element among /domain/metadata's children,
// in our namespace, in a full domain XML (virDomainGetXMLDesc). found is
// false, without error, when the domain carries none: a domain that is not
// ours. The XML being unparsable, or our element being malformed, is an
// error.
func MetadataFromDomainXML(domainXML string) (m Metadata, found bool, err error) {
	d := xml.NewDecoder(strings.NewReader(domainXML))
	var path []string // local names of the open elements
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return Metadata{}, false, errors.New("domain XML: no <domain> element")
		}
		if err != nil {
			return Metadata{}, false, fmt.Errorf("domain XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if len(path) == 0 && t.Name.Local != "domain" {
				return Metadata{}, false, fmt.Errorf("domain XML: root element is <%s>, not <domain>", t.Name.Local)
			}
			if len(path) == 2 && path[1] == "metadata" && t.Name.Space == MetadataNS && t.Name.Local == MetadataElement {
				var x instanceXML
				if err := d.DecodeElement(&x, &t); err != nil {
					return Metadata{}, false, fmt.Errorf("domain metadata: %w", err)
				}
				m, err := x.metadata()
				if err != nil {
					return Metadata{}, false, err
				}
				return m, true, nil
			}
			path = append(path, t.Name.Local)
		case xml.EndElement:
			path = path[:len(path)-1]
			if len(path) == 0 {
				return Metadata{}, false, nil // end of <domain>: not ours
			}
		}
	}
}
