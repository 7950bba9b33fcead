// Command releasecheck proves that jobkey's modules can be fetched by a
// consumer as a release would publish them.
//
// It reads the workspace (go.work) at a git revision, checks that every
// nested module requires its siblings at one version V with no replace
// directive, and writes a file GOPROXY holding each module at V, made from
// that revision as the Go module proxy would make it from a tag
// (<module>/@v/list, V.info, V.mod, V.zip). Then, in a new module outside
// the repository and with GOWORK=off, it runs `go get` of every library
// module at V, builds a program importing each of them, checks that the
// module hashes the consumer recorded are those of the zips it wrote, and
// runs `go install github.com/jobkey/jobkey/cmd/jobkey@V` and the installed
// command.
//
// Modules outside github.com/jobkey/jobkey resolve through `go env GOPROXY`
// and are verified against GOSUMDB, as every other build here does; the
// local module cache's download directory is tried before it, so a warm
// machine fetches nothing. The consumer has a module cache of its own, so a
// jobkey module of the same version left by an earlier run is never used.
//
// Usage, from anywhere in the repository:
//
//	cd scripts/releasecheck && GOWORK=off go run . [-rev HEAD] [-keep]
//
// docs/releasing.md describes the release this checks.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// root is the library module's path; every module published with it is
// under it.
const root = "github.com/jobkey/jobkey"

// command is the package a consumer installs with go install.
const command = root + "/cmd/jobkey"

// mod is one module of the workspace.
type mod struct {
	Path   string // module path
	Dir    string // directory in the repository, "" for the root
	GoMod  []byte // go.mod at the revision
	Parsed *modfile.File
}

func main() {
	rev := flag.String("rev", "HEAD", "the git revision to publish")
	keep := flag.Bool("keep", false, "keep the proxy and the consumer (their paths are printed)")
	flag.Parse()
	if err := run(*rev, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "releasecheck:", err)
		os.Exit(1)
	}
}

func run(rev string, keep bool) error {
	start := time.Now()
	repo, err := output("", nil, "git", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	repo = strings.TrimSpace(repo)
	commit, err := output(repo, nil, "git", "rev-parse", "--verify", rev+"^{commit}")
	if err != nil {
		return err
	}
	commit = strings.TrimSpace(commit)
	mods, version, err := readWorkspace(repo, commit)
	if err != nil {
		return err
	}
	fmt.Printf("releasecheck: %d modules at %s, from %.12s\n", len(mods), version, commit)

	tmp, err := os.MkdirTemp("", "jobkey-releasecheck-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("releasecheck: keeping", tmp)
	} else {
		defer removeAll(tmp)
	}
	proxy := filepath.Join(tmp, "proxy")
	hashes := map[string]string{}
	for _, m := range mods {
		h, err := publish(repo, commit, proxy, m, version)
		if err != nil {
			return err
		}
		hashes[m.Path] = h
	}

	env, err := consumerEnv(tmp, proxy)
	if err != nil {
		return err
	}
	consumer := filepath.Join(tmp, "consumer")
	if err := writeConsumer(consumer, mods); err != nil {
		return err
	}
	get := []string{"get"}
	for _, m := range mods {
		if m.Path != command {
			get = append(get, m.Path+"@"+version)
		}
	}
	steps := [][]string{get, {"build", "-o", filepath.Join(tmp, "consumer.bin"), "."}, {"vet", "."}}
	for _, s := range steps {
		t := time.Now()
		if _, err := output(consumer, env, "go", s...); err != nil {
			return err
		}
		fmt.Printf("releasecheck: go %s: %.1fs\n", s[0], time.Since(t).Seconds())
	}
	if err := checkSums(consumer, mods, version, hashes); err != nil {
		return err
	}
	out, err := output(consumer, nil, filepath.Join(tmp, "consumer.bin"))
	if err != nil {
		return err
	}
	fmt.Print(out)

	bin := filepath.Join(tmp, "bin")
	t := time.Now()
	if _, err := output(tmp, append(env, "GOBIN="+bin), "go", "install", command+"@"+version); err != nil {
		return err
	}
	fmt.Printf("releasecheck: go install: %.1fs\n", time.Since(t).Seconds())
	help, err := output(tmp, nil, filepath.Join(bin, "jobkey"), "help")
	if err != nil {
		return err
	}
	if !strings.Contains(help, "jobkey") {
		return fmt.Errorf("the installed jobkey's help does not name it:\n%s", help)
	}
	fmt.Printf("releasecheck: go get of %d library modules, a build importing each, and go install %s@%s passed in %.1fs\n",
		len(mods)-1, command, version, time.Since(start).Seconds())
	return nil
}

// readWorkspace reads go.work and every module it uses at commit, and
// returns the modules (the root first) and the one version the nested
// modules require of their siblings.
func readWorkspace(repo, commit string) ([]mod, string, error) {
	data, err := show(repo, commit, "go.work")
	if err != nil {
		return nil, "", err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, "", err
	}
	var mods []mod
	for _, u := range work.Use {
		dir := path.Clean(strings.TrimPrefix(filepath.ToSlash(u.Path), "./"))
		if dir == "." {
			dir = ""
		}
		data, err := show(repo, commit, path.Join(dir, "go.mod"))
		if err != nil {
			return nil, "", err
		}
		f, err := modfile.Parse(path.Join(dir, "go.mod"), data, nil)
		if err != nil {
			return nil, "", err
		}
		if f.Module == nil {
			return nil, "", fmt.Errorf("%s: no module line", path.Join(dir, "go.mod"))
		}
		want := root
		if dir != "" {
			want = root + "/" + dir
		}
		if f.Module.Mod.Path != want {
			return nil, "", fmt.Errorf("%s is module %s; in %s it must be %s", path.Join(dir, "go.mod"), f.Module.Mod.Path, dir, want)
		}
		mods = append(mods, mod{Path: want, Dir: dir, GoMod: data, Parsed: f})
	}
	slices.SortFunc(mods, func(a, b mod) int { return strings.Compare(a.Dir, b.Dir) })
	if len(mods) == 0 || mods[0].Path != root {
		return nil, "", errors.New("go.work does not use the library module (.)")
	}

	paths := map[string]bool{}
	for _, m := range mods {
		paths[m.Path] = true
	}
	version := ""
	var problems []string
	for _, m := range mods {
		for _, r := range m.Parsed.Replace {
			problems = append(problems, fmt.Sprintf("%s/go.mod replaces %s: a consumer ignores it, and go install refuses the module", m.Dir, r.Old.Path))
		}
		for _, r := range m.Parsed.Require {
			if !paths[r.Mod.Path] {
				continue
			}
			if version == "" {
				version = r.Mod.Version
			}
			if r.Mod.Version != version {
				problems = append(problems, fmt.Sprintf("%s requires %s %s, another module %s", m.Path, r.Mod.Path, r.Mod.Version, version))
			}
		}
	}
	if version == "" {
		return nil, "", errors.New("no nested module requires the library")
	}
	// go.work reads the unpublished version from the tree: every module a
	// sibling requires needs its line, at that version.
	replaced := map[string]string{}
	for _, r := range work.Replace {
		replaced[r.Old.Path+"@"+r.Old.Version] = path.Clean(strings.TrimPrefix(r.New.Path, "./"))
	}
	for _, m := range mods {
		if m.Path == command {
			continue
		}
		want := m.Dir
		if want == "" {
			want = "."
		}
		if got, ok := replaced[m.Path+"@"+version]; !ok || got != want {
			problems = append(problems, fmt.Sprintf("go.work needs: replace %s %s => ./%s", m.Path, version, m.Dir))
		}
	}
	if len(problems) > 0 {
		return nil, "", errors.New(strings.Join(problems, "\n"))
	}
	return mods, version, nil
}

// publish writes module m at version into the file proxy as the Go
// module proxy serves a tag, and returns the zip's hash (the h1: of go.sum).
func publish(repo, commit, proxy string, m mod, version string) (string, error) {
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	when, err := output(repo, nil, "git", "show", "-s", "--format=%cI", commit)
	if err != nil {
		return "", err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(when))
	if err != nil {
		return "", err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, t.UTC()})
	files, err := archive(repo, commit, m.Dir)
	if err != nil {
		return "", err
	}
	checked, err := modzip.CheckFiles(files)
	if err != nil {
		return "", fmt.Errorf("zip %s: %w", m.Path, err)
	}
	var z bytes.Buffer
	if err := modzip.Create(&z, module.Version{Path: m.Path, Version: version}, files); err != nil {
		return "", fmt.Errorf("zip %s: %w", m.Path, err)
	}
	zipFile := filepath.Join(dir, version+".zip")
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  m.GoMod,
		version + ".zip":  z.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	h, err := dirhash.HashZip(zipFile, dirhash.Hash1)
	if err != nil {
		return "", err
	}
	fmt.Printf("releasecheck: %s@%s: %d files, %d KiB, %s\n", m.Path, version, len(checked.Valid), z.Len()/1024, h)
	return h, nil
}

// archive lists the files of dir at commit as `git archive` gives them,
// which is what the Go command zips when it fetches a tag; the LICENSE at
// the root goes into a nested module that has none, as it does there.
func archive(repo, commit, dir string) ([]modzip.File, error) {
	args := []string{"-c", "core.autocrlf=input", "-c", "core.eol=lf", "archive", "--format=zip", commit}
	if dir != "" {
		args = append(args, dir)
	}
	out, err := output(repo, nil, "git", args...)
	if err != nil {
		return nil, err
	}
	r, err := zip.NewReader(strings.NewReader(out), int64(len(out)))
	if err != nil {
		return nil, err
	}
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	var files []modzip.File
	haveLicense := false
	for _, f := range r.File {
		if strings.HasSuffix(f.Name, "/") || !strings.HasPrefix(f.Name, prefix) {
			continue
		}
		name := strings.TrimPrefix(f.Name, prefix)
		haveLicense = haveLicense || name == "LICENSE"
		files = append(files, zipEntry{name, f})
	}
	if !haveLicense && dir != "" {
		if license, err := show(repo, commit, "LICENSE"); err == nil {
			files = append(files, dataFile{"LICENSE", license})
		}
	}
	return files, nil
}

// consumerEnv is the environment of the consumer's go commands: outside
// any workspace, its own module cache, and the jobkey modules from the
// file proxy only, unchecked by the checksum database (they are not in it).
func consumerEnv(tmp, proxy string) ([]string, error) {
	goproxy, err := output("", nil, "go", "env", "GOPROXY")
	if err != nil {
		return nil, err
	}
	modcache, err := output("", nil, "go", "env", "GOMODCACHE")
	if err != nil {
		return nil, err
	}
	chain := []string{fileURL(proxy)}
	if cache := filepath.Join(strings.TrimSpace(modcache), "cache", "download"); isDir(cache) {
		chain = append(chain, fileURL(cache))
	}
	chain = append(chain, strings.TrimSpace(goproxy))
	env := []string{
		"GOWORK=off",
		// -trimpath keeps the build cache's keys free of the consumer's
		// temporary module cache, so a second run compiles nothing anew.
		"GOFLAGS=-mod=mod -trimpath",
		"GOPROXY=" + strings.Join(chain, ","),
		"GONOSUMDB=" + root,
		"GOPRIVATE=",
		"GONOPROXY=",
		"GOMODCACHE=" + filepath.Join(tmp, "modcache"),
	}
	return env, nil
}

// writeConsumer writes a module that imports every library module and
// uses a name from each.
func writeConsumer(dir string, mods []mod) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var imports, uses []string
	for _, m := range mods {
		if m.Path == command {
			continue
		}
		name, ok := exported[m.Path]
		if !ok {
			imports = append(imports, fmt.Sprintf("\t_ %q", m.Path))
			continue
		}
		imports = append(imports, fmt.Sprintf("\t%q", m.Path))
		uses = append(uses, fmt.Sprintf("\t_ = %s.%s", path.Base(m.Path), name))
	}
	src := "package main\n\nimport (\n\t\"fmt\"\n\n" + strings.Join(imports, "\n") + "\n)\n\nfunc main() {\n" +
		strings.Join(uses, "\n") + "\n\tfmt.Println(\"consumer: built with\", len(jobkey.NewID()), \"byte IDs\")\n}\n"
	goMod := "module example.com/jobkeyconsumer\n\ngo 1.26.0\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644)
}

// exported names one exported function of each library module, so the
// consumer uses each package rather than only importing it.
var exported = map[string]string{
	root:                  "NewID",
	root + "/asynqcompat": "Handler",
	root + "/bench":       "Run",
	root + "/jobkeyotel":  "Middleware",
	root + "/jobkeyui":    "New",
}

// checkSums checks that the consumer's go.sum holds, for every jobkey
// module, the hash of the zip written into the proxy: it was fetched from
// there and nowhere else.
func checkSums(consumer string, mods []mod, version string, hashes map[string]string) error {
	data, err := os.ReadFile(filepath.Join(consumer, "go.sum"))
	if err != nil {
		return err
	}
	sums := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && !strings.HasSuffix(f[1], "/go.mod") {
			sums[f[0]+"@"+f[1]] = f[2]
		}
	}
	for _, m := range mods {
		if m.Path == command {
			continue
		}
		if got := sums[m.Path+"@"+version]; got != hashes[m.Path] {
			return fmt.Errorf("the consumer's go.sum has %s@%s as %q, the proxy's zip is %s", m.Path, version, got, hashes[m.Path])
		}
	}
	return nil
}

// output runs a command in dir (with env added to the environment) and
// returns its standard output; a failure carries its standard error.
func output(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s (in %s): %w\n%s%s", name, strings.Join(args, " "), dir, err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

func show(repo, commit, file string) ([]byte, error) {
	out, err := output(repo, nil, "git", "show", commit+":"+file)
	return []byte(out), err
}

func fileURL(dir string) string {
	return "file://" + filepath.ToSlash(dir)
}

func isDir(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}

// removeAll removes the temporary tree; the module cache's files are
// read-only, so it makes them writable first.
func removeAll(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}

// zipEntry is a file of git's archive.
type zipEntry struct {
	name string
	f    *zip.File
}

func (e zipEntry) Path() string                 { return e.name }
func (e zipEntry) Lstat() (os.FileInfo, error)  { return e.f.FileInfo(), nil }
func (e zipEntry) Open() (io.ReadCloser, error) { return e.f.Open() }

// dataFile is a file held in memory.
type dataFile struct {
	name string
	data []byte
}

func (f dataFile) Path() string                 { return f.name }
func (f dataFile) Lstat() (os.FileInfo, error)  { return dataInfo{f}, nil }
func (f dataFile) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(f.data)), nil }

type dataInfo struct{ f dataFile }

func (i dataInfo) Name() string       { return path.Base(i.f.name) }
func (i dataInfo) Size() int64        { return int64(len(i.f.data)) }
func (i dataInfo) Mode() os.FileMode  { return 0o644 }
func (i dataInfo) ModTime() time.Time { return time.Time{} }
func (i dataInfo) IsDir() bool        { return false }
func (i dataInfo) Sys() any           { return nil }
