// Command image makes the clusterip container image from a binary, without a Docker daemon and
// without pulling a base image, and checks one it made. hack/image.sh builds the binary (static,
// the command's slim build) and runs "build"; .ci/image-check runs "check".
//
// Usage:
//
//	go run . build -binary FILE -version V -dir DIR [-repository R] [-source URL] [-revision SHA] [-platform OS/ARCH]
//	go run . check -dir DIR -version V [-repository R] -extract FILE
//
// build writes the image twice into DIR: DIR/oci, an OCI image layout (skopeo copy oci:DIR/oci:V,
// crane push DIR/oci, podman load), and DIR/clusterip.tar, a tarball that docker load takes, tagged
// R:V. The image is one layer on an empty base holding the binary as /clusterip (mode 0755); its
// config runs it as the entrypoint, as user 65532:65532 (distroless's nonroot), and labels it with
// the OCI annotations org.opencontainers.image.{version,source,revision,title,licenses}. The
// layer's file times and the image's creation time are SOURCE_DATE_EPOCH if set, else the Unix
// epoch, so that one binary always makes the same image digest.
//
// check reads both back and fails unless they are one image (the same config digest) whose config
// has that user, entrypoint and version label, and whose layer holds the binary only, statically
// linked (the empty base has no libc); it writes the binary to FILE for the caller to run.
//
// It is a module of its own so that go-containerregistry enters neither the library's go.mod nor
// the command's.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed parts.
const (
	// DefaultRepository is where the project's images are pushed; the tag is the version.
	DefaultRepository = "ghcr.io/kube-ipam/clusterip"
	// DefaultSource is the repository the image is built from (org.opencontainers.image.source).
	DefaultSource = "https://github.com/kube-ipam/clusterip"
	// Entrypoint is the binary's path in the image.
	Entrypoint = "/clusterip"
	// User is the image's user and group: distroless's nonroot, 65532:65532.
	User = "65532:65532"
	// LayoutDir and TarballFile are what build writes in its directory.
	LayoutDir   = "oci"
	TarballFile = "clusterip.tar"
)

// The OCI annotations the image carries as labels.
const (
	labelVersion  = "org.opencontainers.image.version"
	labelSource   = "org.opencontainers.image.source"
	labelRevision = "org.opencontainers.image.revision"
	labelTitle    = "org.opencontainers.image.title"
	labelLicenses = "org.opencontainers.image.licenses"
	// refName names the image in the layout's index, as skopeo's oci:DIR:TAG reads it.
	refName = "org.opencontainers.image.ref.name"
)

// tagPattern is what a Docker or OCI tag may be; the version is the tag.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image: "+err.Error())
		os.Exit(2)
	}
}

// options are the command line's.
type options struct {
	binary, version, dir, repository, source, revision, platform, extract string
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 || (args[0] != "build" && args[0] != "check") {
		return errors.New("usage: image build|check [flags] (see the package doc)")
	}
	verb := args[0]
	var o options
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", "", "the directory the image is written to (build) or read from (check)")
	fs.StringVar(&o.version, "version", "", "the image's version: its tag and version label")
	fs.StringVar(&o.repository, "repository", DefaultRepository, "the repository of the docker load tarball's tag")
	if verb == "build" {
		fs.StringVar(&o.binary, "binary", "", "the static linux binary to put in the image")
		fs.StringVar(&o.source, "source", DefaultSource, "the org.opencontainers.image.source label")
		fs.StringVar(&o.revision, "revision", "", "the org.opencontainers.image.revision label (a commit); none if empty")
		fs.StringVar(&o.platform, "platform", "linux/amd64", "the binary's OS/ARCH")
	} else {
		fs.StringVar(&o.extract, "extract", "", "where to write the binary taken out of the image's layer")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%s: unexpected arguments %q", verb, fs.Args())
	}
	if o.dir == "" || o.version == "" || (verb == "build" && o.binary == "") || (verb == "check" && o.extract == "") {
		return fmt.Errorf("%s: -dir, -version and %s are required", verb, map[string]string{"build": "-binary", "check": "-extract"}[verb])
	}
	if !tagPattern.MatchString(o.version) {
		return fmt.Errorf("-version %q is not a valid image tag ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})", o.version)
	}
	tag, err := name.NewTag(o.repository+":"+o.version, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image name: %w", err)
	}
	if verb == "build" {
		return build(o, tag, stdout)
	}
	return check(o, tag, stdout)
}

// createdTime is SOURCE_DATE_EPOCH if set, else the Unix epoch: the image's creation time and
// its files' modification time, fixed so that a binary makes one digest.
func createdTime() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// build makes the image of o.binary and writes it into o.dir.
func build(o options, tag name.Tag, stdout io.Writer) error {
	osName, arch, ok := strings.Cut(o.platform, "/")
	if !ok || osName == "" || arch == "" {
		return fmt.Errorf("-platform %q: want OS/ARCH", o.platform)
	}
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return err
	}
	if err := checkStatic(bin); err != nil {
		return fmt.Errorf("%s: %w", o.binary, err)
	}
	created, err := createdTime()
	if err != nil {
		return err
	}
	layerTar, err := layerOf(bin, created)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: created},
		CreatedBy: "hack/image: the clusterip binary at " + Entrypoint,
	}})
	if err != nil {
		return fmt.Errorf("append the layer: %w", err)
	}
	labels := map[string]string{
		labelVersion:  o.version,
		labelSource:   o.source,
		labelTitle:    "clusterip",
		labelLicenses: "Apache-2.0",
	}
	if o.revision != "" {
		labels[labelRevision] = o.revision
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = osName, arch
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       User,
		WorkingDir: "/",
		Labels:     labels,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("config: %w", err)
	}

	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	layoutPath := filepath.Join(o.dir, LayoutDir)
	if err := os.RemoveAll(layoutPath); err != nil {
		return err
	}
	p, err := layout.Write(layoutPath, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refName: o.version})); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	tarPath := filepath.Join(o.dir, TarballFile)
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		return fmt.Errorf("docker tarball: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := layer.Size()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s@%s (%s, one layer of %.1f MB compressed)\n", tag, digest, o.platform, float64(size)/1e6)
	fmt.Fprintf(stdout, "  OCI layout:        %s\n  docker load -i     %s\n", layoutPath, tarPath)
	return nil
}

// layerOf returns the uncompressed tar of the image's one layer: bin at Entrypoint, owned by root,
// executable by all, with modification time t.
func layerOf(bin []byte, t time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     strings.TrimPrefix(Entrypoint, "/"),
		Mode:     0o755,
		Size:     int64(len(bin)),
		ModTime:  t,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkStatic returns an error unless bin is an ELF executable with no program interpreter and no
// shared library: an empty base image has no dynamic loader and no libc to run anything else.
func checkStatic(bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF binary (the image is for Linux): %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it has a program interpreter); build it with CGO_ENABLED=0")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("needs shared libraries %v; build it with CGO_ENABLED=0", libs)
	}
	return nil
}

// check reads the image build wrote into o.dir back from both its forms, checks it and writes its
// binary to o.extract.
func check(o options, tag name.Tag, stdout io.Writer) error {
	idx, err := layout.ImageIndexFromPath(filepath.Join(o.dir, LayoutDir))
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if len(im.Manifests) != 1 {
		return fmt.Errorf("OCI layout: %d manifests, want 1", len(im.Manifests))
	}
	if got := im.Manifests[0].Annotations[refName]; got != o.version {
		return fmt.Errorf("OCI layout: %s = %q, want %q", refName, got, o.version)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	loaded, err := tarball.ImageFromPath(filepath.Join(o.dir, TarballFile), &tag)
	if err != nil {
		return fmt.Errorf("docker tarball, tag %s: %w", tag, err)
	}
	name1, err := img.ConfigName()
	if err != nil {
		return err
	}
	name2, err := loaded.ConfigName()
	if err != nil {
		return err
	}
	if name1 != name2 {
		return fmt.Errorf("the OCI layout's config is %s, the docker tarball's %s; want one image", name1, name2)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	c := cf.Config
	var problems []string
	if c.User != User && c.User != "65532" {
		problems = append(problems, fmt.Sprintf("user %q, want %q", c.User, User))
	}
	if !slices.Equal(c.Entrypoint, []string{Entrypoint}) || len(c.Cmd) != 0 {
		problems = append(problems, fmt.Sprintf("entrypoint %q and cmd %q, want [%q] and none", c.Entrypoint, c.Cmd, Entrypoint))
	}
	if got := c.Labels[labelVersion]; got != o.version {
		problems = append(problems, fmt.Sprintf("label %s = %q, want %q", labelVersion, got, o.version))
	}
	if c.Labels[labelSource] == "" {
		problems = append(problems, "no label "+labelSource)
	}
	if len(problems) > 0 {
		return fmt.Errorf("image config: %s", strings.Join(problems, "; "))
	}

	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) != 1 {
		return fmt.Errorf("%d layers, want 1 on an empty base", len(layers))
	}
	bin, err := binaryOf(layers[0])
	if err != nil {
		return err
	}
	if err := checkStatic(bin); err != nil {
		return fmt.Errorf("the image's %s: %w", Entrypoint, err)
	}
	if err := os.MkdirAll(filepath.Dir(o.extract), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.extract, bin, 0o755); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s@%s: %s/%s, user %s, entrypoint %q, labels %v; %s (%.1f MB, static) written to %s\n",
		tag, digest, cf.OS, cf.Architecture, c.User, c.Entrypoint, c.Labels, Entrypoint, float64(len(bin))/1e6, o.extract)
	return nil
}

// binaryOf returns the content of the layer's one file, Entrypoint, and an error if the layer
// holds anything else or it is not executable.
func binaryOf(layer v1.Layer) ([]byte, error) {
	rc, err := layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var bin []byte
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
		if "/"+strings.TrimPrefix(hdr.Name, "./") != Entrypoint || hdr.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("layer holds %s, want %s only", hdr.Name, Entrypoint)
		}
		if hdr.Mode&0o111 != 0o111 {
			return nil, fmt.Errorf("layer's %s has mode %o, want it executable by all", hdr.Name, hdr.Mode)
		}
		if bin, err = io.ReadAll(tr); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	if bin == nil {
		return nil, fmt.Errorf("layer has no %s", Entrypoint)
	}
	return bin, nil
}
