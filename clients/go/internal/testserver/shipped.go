package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// CopyShippedFiles copies the files git would ship under dir of the
// repository at root (tracked, and untracked but not ignored) to the same
// relative paths under dest: a user's "checkout", in which a file that is
// ignored but exists here (stubs generated locally) cannot hide a packaging
// defect.
func CopyShippedFiles(root, dir, dest string) error {
	git, err := exec.LookPath("git")
	if err != nil {
		return fmt.Errorf("git is needed to list the files the SDK ships: %w", err)
	}
	list, err := exec.Command(git, "-C", root, "ls-files", "-z", "-co", "--exclude-standard", "--", dir).Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	files := strings.Split(strings.TrimSuffix(string(list), "\x00"), "\x00")
	if len(files) < 2 {
		return fmt.Errorf("git ls-files lists %d files under %s", len(files), dir)
	}
	for _, rel := range files {
		src := filepath.Join(root, rel)
		info, err := os.Stat(src)
		if os.IsNotExist(err) {
			continue // tracked but deleted in the work tree: not shipped by this checkout
		}
		if err != nil {
			return err
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		target := filepath.Join(dest, rel)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, data, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// ReadmeBlock is the first ```lang block of the markdown file at path that
// contains marker.
func ReadmeBlock(path, lang, marker string) (string, error) {
	readme, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, m := range regexp.MustCompile("(?s)```"+regexp.QuoteMeta(lang)+"\n(.*?)```").FindAllSubmatch(readme, -1) {
		if bytes.Contains(m[1], []byte(marker)) {
			return string(m[1]), nil
		}
	}
	return "", errors.New(path + " has no ```" + lang + " block containing " + fmt.Sprintf("%q", marker))
}
