//! Writes every target's seeds (`ephd_fuzz::seeds`) to
//! `<dir>/<target>/<name>`, `<dir>` being the first argument
//! (scripts/fuzz.sh passes `fuzz/seeds`). Files are overwritten, so the
//! checked-in seeds can be regenerated after the generator changes.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/seeds".into()),
    );
    for target in ephd_fuzz::TARGETS {
        let into = dir.join(target);
        std::fs::create_dir_all(&into).expect("create the seed directory");
        for (name, bytes) in ephd_fuzz::seeds::seeds(target) {
            std::fs::write(into.join(&name), bytes).expect("write a seed");
        }
    }
}
