// Command normalize rewrites the image `podman build` saved (a docker
// archive) without the two fields of its configuration that differ from
// one build to the next, and writes it as the archive `make image` ships
// and loads, so that the same sources give the same image id.
//
// podman build --timestamp dates the image, its history and its files, but
// podman 4.3 (buildah 1.28, Debian 12's) still writes the id of its build
// container ("container") and a hostname made from it ("Hostname") into a
// docker-format configuration; buildah 1.41 blanks them itself under
// --timestamp. The docker format is kept for its HEALTHCHECK, which the OCI
// format has no field for.
//
// go-containerregistry reads and writes the archive: the format (manifest,
// config, layers, their digests) is not the daemon's business to re-implement.
//
//	normalize -tag localhost/wlproj:1.2.3 built.tar wlproj_1.2.3_amd64.image.tar
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	tag := flag.String("tag", "", "the image's name and tag in the archive written (e.g. localhost/wlproj:1.2.3)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: normalize -tag NAME:TAG BUILT.tar OUT.tar")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *tag == "" || flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	if err := normalize(flag.Arg(0), flag.Arg(1), *tag); err != nil {
		fmt.Fprintln(os.Stderr, "normalize:", err)
		os.Exit(1)
	}
}

// normalize reads the one image of the docker archive built, blanks its
// build container's id and hostname, and writes it to out under tag.
func normalize(built, out, tag string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", tag, err)
	}
	img, err := tarball.ImageFromPath(built, nil)
	if err != nil {
		return fmt.Errorf("reading %s: %w", built, err)
	}
	config, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the configuration in %s: %w", built, err)
	}
	config = config.DeepCopy()
	config.Container = ""
	config.Config.Hostname = ""
	img, err = mutate.ConfigFile(img, config)
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}
