package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"github.com/jobkey/jobkey/internal/redact"
)

// refuseRepeats makes every flag of fs refuse a second value. The flag
// package lets the last one win, so `delete -queue a x1 -queue b x2`
// deleted x1 from queue b: a flag given twice is an error instead.
func refuseRepeats(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if isZeroDefault(f) {
			f.DefValue = "" // the usage tells a zero default by "", a onceValue's zero String
		}
		f.Value = &onceValue{Value: f.Value, name: f.Name}
	})
}

// isZeroDefault tells whether f's default is its type's zero value (0,
// false, ""), which the usage leaves out, as the flag package does.
func isZeroDefault(f *flag.Flag) (zero bool) {
	defer func() {
		if recover() != nil { // a zero value whose String panics, as the flag package allows
			zero = false
		}
	}()
	t := reflect.TypeOf(f.Value)
	if t.Kind() != reflect.Pointer {
		return false
	}
	z, ok := reflect.New(t.Elem()).Interface().(flag.Value)
	return ok && z.String() == f.DefValue
}

// parseFlags parses args with fs, refusing a flag given twice.
func parseFlags(fs *flag.FlagSet, args []string) error {
	refuseRepeats(fs)
	return fs.Parse(args)
}

// onceValue is a flag's value that takes one Set.
type onceValue struct {
	flag.Value
	name string
	set  bool
}

func (v *onceValue) Set(s string) error {
	if v.set {
		// The values are not echoed: one may be a URL with a password.
		return fmt.Errorf("-%s is given twice: give each flag once", v.name)
	}
	v.set = true
	return v.Value.Set(s)
}

// String is the value's; the flag package calls it on a zero onceValue too
// (to tell whether a default is worth printing in the usage).
func (v *onceValue) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}

// IsBoolFlag keeps a bool flag one that takes no value (-yes, not -yes=true).
func (v *onceValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// secretURLs returns the Redis URLs the command was given, which may hold
// a password: every argument that looks like a URL, the value of -redis
// in every form, and REDIS_URL.
func secretURLs(args []string) []string {
	urls := []string{os.Getenv("REDIS_URL")}
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case strings.HasPrefix(a, "-") && name == "redis" && hasVal:
			urls = append(urls, val)
		case strings.HasPrefix(a, "-") && name == "redis" && i+1 < len(args):
			urls = append(urls, args[i+1])
		case strings.Contains(a, "://"):
			urls = append(urls, a)
		}
	}
	return urls
}

// redactingWriter is an output of the command: the passwords of urls never
// reach it, whoever writes (the flag package prints its errors itself).
type redactingWriter struct {
	w    io.Writer
	urls []string
}

func (r redactingWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, redact.Text(string(p), r.urls...)); err != nil {
		return 0, err
	}
	return len(p), nil
}
