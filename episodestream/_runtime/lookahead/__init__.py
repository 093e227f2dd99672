"""Reading ahead of the samples: decode groups planned and decoded ahead, remote row reads started with their video, DataLoader workers' download turns."""
