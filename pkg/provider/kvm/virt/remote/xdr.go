package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
)

// Marshal encodes v in XDR (RFC 4506) the way go-libvirt's client encodes
// and decodes its generated types, so those types (libvirt.XxxArgs,
// libvirt.XxxRet, the event messages) can be used on the server side as
// they are: integers of 32 bits or less take 4 bytes, 64-bit ones 8; bool
// 4; string and []byte a length and padded bytes; [N]byte N padded bytes;
// other slices a count and their elements, other arrays their elements;
// structs their exported fields in order; an interface its concrete value
// (a libvirt.TypedParamValue is its discriminant, then that value).
func Marshal(v any) ([]byte, error) {
	var e encoder
	if err := e.encode(reflect.ValueOf(v)); err != nil {
		return nil, err
	}
	return e.b, nil
}

// Unmarshal decodes data into v, a pointer, by Marshal's rules. Interfaces
// cannot be decoded (no call argument the server reads has one), and data
// must be used up exactly: a shorter or longer payload is a protocol error.
func Unmarshal(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("xdr: decode into %T: want a non-nil pointer", v)
	}
	d := decoder{b: data}
	if err := d.decode(rv.Elem()); err != nil {
		return err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("xdr: %d bytes left over decoding %T", len(d.b), v)
	}
	return nil
}

type encoder struct{ b []byte }

func (e *encoder) u32(x uint32) { e.b = binary.BigEndian.AppendUint32(e.b, x) }
func (e *encoder) u64(x uint64) { e.b = binary.BigEndian.AppendUint64(e.b, x) }

func (e *encoder) opaque(p []byte) {
	e.b = append(e.b, p...)
	for len(e.b)%4 != 0 {
		e.b = append(e.b, 0)
	}
}

//nolint:gocyclo // one case per XDR kind
func (e *encoder) encode(v reflect.Value) error {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return fmt.Errorf("xdr: cannot encode a nil %s", v.Type())
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int:
		e.u32(uint32(int32(v.Int())))
	case reflect.Int64:
		e.u64(uint64(v.Int()))
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint:
		e.u32(uint32(v.Uint()))
	case reflect.Uint64:
		e.u64(v.Uint())
	case reflect.Bool:
		if v.Bool() {
			e.u32(1)
		} else {
			e.u32(0)
		}
	case reflect.Float64:
		e.u64(math.Float64bits(v.Float()))
	case reflect.String:
		e.u32(uint32(v.Len()))
		e.opaque([]byte(v.String()))
	case reflect.Slice:
		e.u32(uint32(v.Len()))
		if v.Type().Elem().Kind() == reflect.Uint8 {
			e.opaque(v.Bytes())
			return nil
		}
		return e.elements(v)
	case reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			p := make([]byte, v.Len())
			reflect.Copy(reflect.ValueOf(p), v)
			e.opaque(p)
			return nil
		}
		return e.elements(v)
	case reflect.Struct:
		t := v.Type()
		for i := range v.NumField() {
			if !t.Field(i).IsExported() {
				continue
			}
			if err := e.encode(v.Field(i)); err != nil {
				return fmt.Errorf("%s.%s: %w", t.Name(), t.Field(i).Name, err)
			}
		}
	case reflect.Interface:
		if v.IsNil() {
			return errors.New("xdr: cannot encode a nil interface")
		}
		return e.encode(v.Elem())
	default:
		return fmt.Errorf("xdr: cannot encode %s", v.Type())
	}
	return nil
}

func (e *encoder) elements(v reflect.Value) error {
	for i := range v.Len() {
		if err := e.encode(v.Index(i)); err != nil {
			return err
		}
	}
	return nil
}

type decoder struct{ b []byte }

var errShort = errors.New("xdr: payload too short")

func (d *decoder) take(n int) ([]byte, error) {
	if n < 0 || n > len(d.b) {
		return nil, errShort
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p, nil
}

func (d *decoder) u32() (uint32, error) {
	p, err := d.take(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(p), nil
}

func (d *decoder) u64() (uint64, error) {
	p, err := d.take(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(p), nil
}

// opaque reads n bytes and their padding.
func (d *decoder) opaque(n int) ([]byte, error) {
	p, err := d.take(n)
	if err != nil {
		return nil, err
	}
	if _, err := d.take((4 - n%4) % 4); err != nil {
		return nil, err
	}
	return p, nil
}

// count reads a length, refusing one longer than what is left of the
// payload: every element takes at least a byte, so a corrupt count cannot
// make a huge allocation.
func (d *decoder) count() (int, error) {
	n, err := d.u32()
	if err != nil {
		return 0, err
	}
	if int64(n) > int64(len(d.b)) {
		return 0, errShort
	}
	return int(n), nil
}

//nolint:gocyclo // one case per XDR kind
func (d *decoder) decode(v reflect.Value) error {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return d.decode(v.Elem())
	}
	switch v.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int:
		x, err := d.u32()
		v.SetInt(int64(int32(x)))
		return err
	case reflect.Int64:
		x, err := d.u64()
		v.SetInt(int64(x))
		return err
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint:
		x, err := d.u32()
		v.SetUint(uint64(x))
		return err
	case reflect.Uint64:
		x, err := d.u64()
		v.SetUint(x)
		return err
	case reflect.Bool:
		x, err := d.u32()
		v.SetBool(x != 0)
		return err
	case reflect.Float64:
		x, err := d.u64()
		v.SetFloat(math.Float64frombits(x))
		return err
	case reflect.String:
		n, err := d.count()
		if err != nil {
			return err
		}
		p, err := d.opaque(n)
		v.SetString(string(p))
		return err
	case reflect.Slice:
		n, err := d.count()
		if err != nil || n == 0 {
			return err // zero elements decode to nil, as go-libvirt's decoder leaves them
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			p, err := d.opaque(n)
			v.SetBytes(append([]byte(nil), p...))
			return err
		}
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		return d.elements(v)
	case reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			p, err := d.opaque(v.Len())
			reflect.Copy(v, reflect.ValueOf(p))
			return err
		}
		return d.elements(v)
	case reflect.Struct:
		t := v.Type()
		for i := range v.NumField() {
			if !t.Field(i).IsExported() {
				continue
			}
			if err := d.decode(v.Field(i)); err != nil {
				return fmt.Errorf("%s.%s: %w", t.Name(), t.Field(i).Name, err)
			}
		}
		return nil
	}
	return fmt.Errorf("xdr: cannot decode %s", v.Type())
}

func (d *decoder) elements(v reflect.Value) error {
	for i := range v.Len() {
		if err := d.decode(v.Index(i)); err != nil {
			return err
		}
	}
	return nil
}
