"""Running as a rank: detect the launcher's environment, bind a device, pick the network
interface and initialise torch.distributed (`distributed.init`), or start ranks (`launch`)."""
