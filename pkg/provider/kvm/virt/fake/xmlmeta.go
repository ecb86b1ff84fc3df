package fake

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
)

// Domain <metadata> handling, modelled on libvirt's virxml.c:
//
//   - at define, virXMLNodeSanitizeNamespaces keeps only the first child
//     element per namespace and drops children without a namespace; blank
//     text is dropped (libvirt parses with xmlKeepBlanksDefault(0));
//   - namespaces a child inherits from <domain> or <metadata> are declared
//     on the child itself, as libxml2's xmlCopyNode reconciles them;
//   - virDomainGetMetadata(ELEMENT, uri) (virXMLExtractNamespaceXML) returns
//     the first child in uri with every element in uri unprefixed and the
//     first declaration of uri on that child removed; anything else (other
//     namespaces, attributes) is left as is.
//
// encoding/xml cannot do this (its encoder rewrites namespaces), so the
// metadata subtree is kept as a small tree of raw names plus resolved URIs.

const xmlNamespaceURI = "http://www.w3.org/XML/1998/namespace"

type xnode struct {
	uri    string     // resolved namespace URI, "" if none
	prefix string     // as written ("" for default namespace or none)
	local  string     // local name
	decls  []xml.Attr // namespace declarations written on this element
	attrs  []xml.Attr // other attributes; Name.Space holds the prefix
	kids   []any      // *xnode or string (character data)
}

type nsScope []map[string]string // innermost last; "" key is the default namespace

func (s nsScope) resolve(prefix string) (string, bool) {
	if prefix == "xml" {
		return xmlNamespaceURI, true
	}
	for i := len(s) - 1; i >= 0; i-- {
		if uri, ok := s[i][prefix]; ok {
			return uri, true
		}
	}
	return "", prefix == ""
}

// flatten returns the prefix→URI bindings in effect.
func (s nsScope) flatten() map[string]string {
	out := map[string]string{}
	for _, m := range s {
		for p, u := range m {
			out[p] = u
		}
	}
	return out
}

func isDecl(a xml.Attr) (prefix string, ok bool) {
	switch {
	case a.Name.Space == "xmlns":
		return a.Name.Local, true
	case a.Name.Space == "" && a.Name.Local == "xmlns":
		return "", true
	}
	return "", false
}

// parseDomainDoc checks the root element and returns the sanitized children
// of /domain/metadata.
func parseDomainDoc(doc string) (root string, meta []*xnode, err error) {
	d := xml.NewDecoder(strings.NewReader(doc))
	var p docParser
	for {
		tok, err := d.RawToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return p.root, nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if err := p.start(t); err != nil {
				return p.root, nil, err
			}
		case xml.EndElement:
			p.end()
		case xml.CharData:
			p.text(t)
		}
	}
	switch {
	case p.depth > 0:
		return p.root, nil, errors.New("premature end of data")
	case p.root == "":
		return "", nil, errors.New("start tag expected")
	}
	return p.root, p.meta, nil
}

// docParser is parseDomainDoc's state between tokens.
type docParser struct {
	root  string
	meta  []*xnode // nil until </metadata>, unless a child was kept
	scope nsScope
	stack []*xnode // open metadata elements
	// bindings in scope at the current metadata child's start tag
	inherited map[string]string
	depth     int
	inMeta    bool
}

func (p *docParser) start(t xml.StartElement) error {
	p.depth++
	frame := map[string]string{}
	var decls, attrs []xml.Attr
	for _, a := range t.Attr {
		if prefix, ok := isDecl(a); ok {
			frame[prefix] = a.Value
			decls = append(decls, a)
		} else {
			attrs = append(attrs, a)
		}
	}
	p.scope = append(p.scope, frame)
	switch {
	case p.depth == 1:
		p.root = t.Name.Local
		if t.Name.Space != "" {
			p.root = t.Name.Space + ":" + t.Name.Local
		}
	case p.depth == 2 && t.Name.Space == "" && t.Name.Local == "metadata" && !p.inMeta && p.meta == nil:
		p.inMeta = true
	case p.inMeta:
		return p.openMetaElement(t, decls, attrs)
	}
	return nil
}

// openMetaElement adds an element inside <metadata> to the tree: a child
// of <metadata> itself only if sanitizing keeps it.
func (p *docParser) openMetaElement(t xml.StartElement, decls, attrs []xml.Attr) error {
	uri, ok := p.scope.resolve(t.Name.Space)
	if !ok {
		return fmt.Errorf("namespace prefix %q is not defined", t.Name.Space)
	}
	n := &xnode{uri: uri, prefix: t.Name.Space, local: t.Name.Local, decls: decls, attrs: attrs}
	if len(p.stack) > 0 {
		parent := p.stack[len(p.stack)-1]
		parent.kids = append(parent.kids, n)
	} else {
		p.inherited = p.scope[:len(p.scope)-1].flatten()
		if sanitized(p.meta, n) {
			p.meta = append(p.meta, n)
		}
	}
	p.stack = append(p.stack, n)
	return nil
}

func (p *docParser) end() {
	if p.inMeta {
		p.closeMetaElement()
	}
	p.scope = p.scope[:len(p.scope)-1]
	p.depth--
}

// closeMetaElement ends an element inside <metadata>, or <metadata> itself.
func (p *docParser) closeMetaElement() {
	if len(p.stack) == 0 {
		p.inMeta = false // </metadata>
		if p.meta == nil {
			p.meta = []*xnode{} // remember metadata was seen
		}
		return
	}
	n := p.stack[len(p.stack)-1]
	p.stack = p.stack[:len(p.stack)-1]
	if len(p.stack) == 0 {
		n.reconcile(n, p.inherited, map[string]bool{})
	}
}

func (p *docParser) text(t xml.CharData) {
	if len(p.stack) > 0 && strings.TrimSpace(string(t)) != "" {
		parent := p.stack[len(p.stack)-1]
		parent.kids = append(parent.kids, string(t))
	}
}

// sanitized reports whether virXMLNodeSanitizeNamespaces keeps n next to meta.
func sanitized(meta []*xnode, n *xnode) bool {
	if n.uri == "" {
		return false
	}
	for _, m := range meta {
		if m.uri == n.uri {
			return false
		}
	}
	return true
}

// reconcile declares on top every prefix n's subtree uses without declaring
// it, taking the binding from inherited.
func (n *xnode) reconcile(top *xnode, inherited map[string]string, declared map[string]bool) {
	local := maps.Clone(declared)
	for _, a := range n.decls {
		p, _ := isDecl(a)
		local[p] = true
	}
	need := func(prefix string) {
		if prefix == "xml" || local[prefix] {
			return
		}
		for _, a := range top.decls {
			if p, _ := isDecl(a); p == prefix {
				return // declared on top by an earlier reconciliation
			}
		}
		if uri, ok := inherited[prefix]; ok && uri != "" {
			top.declare(prefix, uri)
		}
	}
	need(n.prefix)
	for _, a := range n.attrs {
		if a.Name.Space != "" {
			need(a.Name.Space)
		}
	}
	for _, k := range n.kids {
		if c, ok := k.(*xnode); ok {
			c.reconcile(top, inherited, local)
		}
	}
}

func (n *xnode) declare(prefix, uri string) {
	name := xml.Name{Space: "xmlns", Local: prefix}
	if prefix == "" {
		name = xml.Name{Local: "xmlns"}
	}
	n.decls = append(n.decls, xml.Attr{Name: name, Value: uri})
}

// String renders n as stored in the domain definition.
func (n *xnode) String() string {
	var b strings.Builder
	n.write(&b, "", false)
	return b.String()
}

// extract renders n as virDomainGetMetadata returns it for uri.
func (n *xnode) extract(uri string) string {
	var b strings.Builder
	n.write(&b, uri, true)
	return b.String()
}

func (n *xnode) write(b *strings.Builder, strip string, top bool) {
	name := n.local
	if n.prefix != "" && (strip == "" || n.uri != strip) {
		name = n.prefix + ":" + n.local
	}
	b.WriteString("<" + name)
	dropped := false
	for _, a := range n.decls {
		if top && !dropped && a.Value == strip {
			dropped = true // libvirt unlinks exactly one declaration of uri
			continue
		}
		writeAttr(b, a)
	}
	for _, a := range n.attrs {
		writeAttr(b, a)
	}
	if len(n.kids) == 0 {
		b.WriteString("/>")
		return
	}
	b.WriteString(">")
	for _, k := range n.kids {
		switch k := k.(type) {
		case string:
			_ = xml.EscapeText(b, []byte(k))
		case *xnode:
			k.write(b, strip, false)
		}
	}
	b.WriteString("</" + name + ">")
}

func writeAttr(b *strings.Builder, a xml.Attr) {
	b.WriteString(" ")
	if a.Name.Space != "" {
		b.WriteString(a.Name.Space + ":")
	}
	b.WriteString(a.Name.Local + `="`)
	_ = xml.EscapeText(b, []byte(a.Value))
	b.WriteString(`"`)
}
