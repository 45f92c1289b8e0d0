// Command modproxy publishes modules of this repository, at one git revision and one version,
// into a directory laid out as a file-based module proxy (GOPROXY=file://DIR), as the Go module
// proxy would serve them once the revision is tagged: DIR/<escaped module path>/@v/ holds list,
// <version>.info, <version>.mod and <version>.zip. The zip is made from the files git has at the
// revision, as the go command takes them from a tag (git archive; nested modules left out, the
// repository's LICENSE added to a nested module that has none; golang.org/x/mod/zip.Create), so
// its hash is the one the proxy will compute from the tag. hack/release.sh uses it to fill the command's go.sum before tagging, and to prove
// `go install …@version` before anything is pushed.
//
// Usage:
//
//	go run . -repo ROOT -rev REV -version vX.Y.Z -dir DIR [SUBDIR ...]
//
// Each SUBDIR is a module's directory relative to ROOT ("." for the root module); the module path
// is read from its go.mod at REV. It is a module of its own so that golang.org/x/mod enters
// neither the library's go.mod nor the command's.
package main

import (
	stdzip "archive/zip"
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
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy: "+err.Error())
		os.Exit(2)
	}
}

// options are the command line's.
type options struct {
	repo, rev, version, dir string
	subdirs                 []string
}

func parse(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("modproxy", flag.ContinueOnError)
	fs.StringVar(&o.repo, "repo", ".", "the git repository's root")
	fs.StringVar(&o.rev, "rev", "HEAD", "the git revision to publish")
	fs.StringVar(&o.version, "version", "", "the version to publish the modules at (required), such as v0.1.0")
	fs.StringVar(&o.dir, "dir", "", "the file-based module proxy directory to publish into (required)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.subdirs = fs.Args()
	switch {
	case o.version == "" || o.dir == "":
		return o, errors.New("-version and -dir are required")
	case !semver.IsValid(o.version) || semver.Canonical(o.version) != o.version:
		return o, fmt.Errorf("-version %q: want a canonical semantic version such as v0.1.0", o.version)
	case len(o.subdirs) == 0:
		return o, errors.New("name at least one module directory")
	}
	return o, nil
}

func run(args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	when, err := commitTime(o.repo, o.rev)
	if err != nil {
		return err
	}
	for _, sub := range o.subdirs {
		p, err := publish(o, path.Clean(filepath.ToSlash(sub)), when)
		if err != nil {
			return fmt.Errorf("module in %s: %w", sub, err)
		}
		fmt.Printf("%s@%s\n", p, o.version)
	}
	return nil
}

// commitTime returns the committer time of rev, which the proxy reports as the version's time.
func commitTime(repo, rev string) (time.Time, error) {
	out, err := git(repo, "show", "-s", "--format=%cI", rev+"^{commit}")
	if err != nil {
		return time.Time{}, err
	}
	return time.Parse(time.RFC3339, strings.TrimSpace(string(out)))
}

// publish writes the module in subdir at o.rev into o.dir at o.version and returns its path.
func publish(o options, subdir string, when time.Time) (string, error) {
	gomodPath := "go.mod"
	if subdir != "." {
		gomodPath = subdir + "/go.mod"
	}
	gomod, err := git(o.repo, "show", o.rev+":"+gomodPath)
	if err != nil {
		return "", err
	}
	modPath := modfile.ModulePath(gomod)
	if modPath == "" {
		return "", fmt.Errorf("%s at %s names no module", gomodPath, o.rev)
	}
	m := module.Version{Path: modPath, Version: o.version}
	if err := module.Check(m.Path, m.Version); err != nil {
		return "", err
	}
	escaped, err := module.EscapePath(m.Path)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(o.dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	files, err := filesAt(o.repo, o.rev, subdir)
	if err != nil {
		return "", err
	}
	var z bytes.Buffer
	if err := zip.Create(&z, m, files); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{o.version, when.UTC()})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{".zip": z.Bytes(), ".mod": gomod, ".info": info} {
		if err := os.WriteFile(filepath.Join(dir, o.version+name), data, 0o644); err != nil {
			return "", err
		}
	}
	return m.Path, addToList(filepath.Join(dir, "list"), o.version)
}

// filesAt returns the files git has at rev under subdir, as the go command reads a module from a
// tag: those git archive writes (so export-ignore is honoured), plus the repository's LICENSE
// for a module in a subdirectory that has none. zip.Create leaves out what a module zip never
// holds (nested modules, vendor/ but modules.txt, VCS directories). It is
// golang.org/x/mod/zip.CreateFromVCS's selection, which refuses a git worktree.
func filesAt(repo, rev, subdir string) ([]zip.File, error) {
	args := []string{"-c", "core.autocrlf=input", "-c", "core.eol=lf", "archive", "--format=zip", rev}
	if subdir != "." {
		args = append(args, subdir)
	}
	archive, err := git(repo, args...)
	if err != nil {
		return nil, err
	}
	zr, err := stdzip.NewReader(bytes.NewReader(archive), int64(len(archive)))
	if err != nil {
		return nil, err
	}
	prefix := ""
	if subdir != "." {
		prefix = subdir + "/"
	}
	var files []zip.File
	haveLICENSE := false
	for _, f := range zr.File {
		name, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || name == "" || strings.HasSuffix(name, "/") {
			continue
		}
		files = append(files, archived{name: name, f: f})
		haveLICENSE = haveLICENSE || name == "LICENSE"
	}
	if !haveLICENSE && subdir != "." {
		if license, err := git(repo, "cat-file", "blob", rev+":LICENSE"); err == nil {
			files = append(files, inMemory{name: "LICENSE", data: license})
		}
	}
	return files, nil
}

// archived is a file of git archive's zip.
type archived struct {
	name string
	f    *stdzip.File
}

func (a archived) Path() string                 { return a.name }
func (a archived) Lstat() (os.FileInfo, error)  { return a.f.FileInfo(), nil }
func (a archived) Open() (io.ReadCloser, error) { return a.f.Open() }

// inMemory is a file held in memory.
type inMemory struct {
	name string
	data []byte
}

func (m inMemory) Path() string                 { return m.name }
func (m inMemory) Lstat() (os.FileInfo, error)  { return memInfo(m), nil }
func (m inMemory) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(m.data)), nil }

// memInfo is the os.FileInfo of an inMemory file: a regular file.
type memInfo inMemory

func (i memInfo) Name() string       { return path.Base(i.name) }
func (i memInfo) Size() int64        { return int64(len(i.data)) }
func (i memInfo) Mode() os.FileMode  { return 0o644 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }

// addToList adds version to the proxy's list of a module's versions, once.
func addToList(file, version string) error {
	data, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(data))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(file, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// git runs git in repo and returns its standard output; its error carries git's stderr.
func git(repo string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
