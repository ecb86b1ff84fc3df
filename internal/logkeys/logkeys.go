// Package logkeys keeps every log line free of repeated keys.
//
// Layers add the keys they know: a controller adds "host" for the KVMHost
// it reconciles, the connection pool adds "host" for the link it dials,
// controller-runtime adds the object's name. zap encodes each WithValues
// as given, so a line could carry "host" twice. Wrap holds the key/value
// pairs itself and hands the sink one merged list per line, in which a key
// appears once, at its first position, with the innermost (latest) value.
package logkeys

import "github.com/go-logr/logr"

// Wrap returns l with repeated keys merged on every line.
func Wrap(l logr.Logger) logr.Logger {
	if l.GetSink() == nil {
		return l
	}
	under := l.GetSink()
	// The wrapped sink was initialised by its logger; its caller is now one
	// frame further down (this sink's method).
	if cd, ok := under.(logr.CallDepthLogSink); ok {
		under = cd.WithCallDepth(1)
	}
	return logr.New(&sink{under: under})
}

type sink struct {
	under logr.LogSink
	kvs   []any
}

var (
	_ logr.LogSink          = (*sink)(nil)
	_ logr.CallDepthLogSink = (*sink)(nil)
)

// Init does nothing: the wrapped sink was initialised by its own logger,
// and a second Init would add its call depth again.
func (s *sink) Init(logr.RuntimeInfo) {}

func (s *sink) Enabled(level int) bool { return s.under.Enabled(level) }

func (s *sink) Info(level int, msg string, kvs ...any) {
	s.under.Info(level, msg, merge(s.kvs, kvs)...)
}

func (s *sink) Error(err error, msg string, kvs ...any) {
	s.under.Error(err, msg, merge(s.kvs, kvs)...)
}

func (s *sink) WithValues(kvs ...any) logr.LogSink {
	return &sink{under: s.under, kvs: merge(s.kvs, kvs)}
}

func (s *sink) WithName(name string) logr.LogSink {
	return &sink{under: s.under.WithName(name), kvs: s.kvs}
}

func (s *sink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.under.(logr.CallDepthLogSink); ok {
		return &sink{under: cd.WithCallDepth(depth), kvs: s.kvs}
	}
	return s
}

// merge returns outer followed by inner with each key once: a key of inner
// already in outer replaces its value there. A non-string key or a missing
// value is passed on as it is, for the sink to report as it does.
func merge(outer, inner []any) []any {
	if len(inner) == 0 {
		return outer
	}
	out := make([]any, 0, len(outer)+len(inner))
	out = append(out, outer...)
	at := make(map[string]int, (len(outer)+len(inner))/2)
	for i := 0; i+1 < len(out); i += 2 {
		if k, ok := out[i].(string); ok {
			if _, seen := at[k]; !seen {
				at[k] = i
			}
		}
	}
	for i := 0; i < len(inner); i += 2 {
		if i+1 >= len(inner) {
			out = append(out, inner[i])
			break
		}
		k, ok := inner[i].(string)
		if j, seen := at[k]; ok && seen {
			out[j+1] = inner[i+1]
			continue
		}
		if ok {
			at[k] = len(out)
		}
		out = append(out, inner[i], inner[i+1])
	}
	return out
}
