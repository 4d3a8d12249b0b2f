//! The interposer's exports bind to its own definitions within the
//! library: a reference to one of its functions (the wrapper that `dlsym`
//! hands out, a call to its own `dlopen`) is to its own code, never to a
//! function of the same name in a library preloaded before it (another
//! interposer, whose lookup of the driver's function would otherwise be
//! answered with its own function, recursing for ever).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
