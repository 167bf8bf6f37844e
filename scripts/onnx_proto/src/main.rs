fn main() {
    let fds = protox::compile(["onnx.proto"], ["."]).expect("compile onnx.proto");
    let mut cfg = prost_build::Config::new();
    cfg.out_dir("out");
    std::fs::create_dir_all("out").unwrap();
    cfg.compile_fds(fds).expect("generate");
}
