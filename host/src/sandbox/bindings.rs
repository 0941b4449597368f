//! The only `bindgen!` in leash: host bindings for `wit/plugin.wit`.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "leash:plugin/plugin",
    imports: { default: async },
    exports: { default: async },
});
